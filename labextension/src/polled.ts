/**
 * A section of the Containers panel that polls the server for its list: the
 * Jobs and Clusters sections. It refreshes every `refreshInterval` seconds of
 * the settings (following their changes), backs off while the server fails,
 * stands by while hidden, starts when first shown and refreshes at once when
 * shown again. A subclass says only how to fetch and show its list.
 */

import { PanelWithToolbar, refreshIcon, ToolbarButton } from '@jupyterlab/ui-components';
import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { Settings } from './settings';
import { h, setText } from './util';

export interface IPolledSectionOptions {
  settings: Settings;
  /** The section's id and its class, e.g. `jobs` gives jp-PodmanHpc-jobs and jp-PodmanHpc-jobsSection. */
  name: string;
  label: string;
  /** What the list holds, for the refresh button and screen readers. */
  listLabel: string;
}

export abstract class PolledSection extends PanelWithToolbar {
  protected readonly status: HTMLElement;
  protected readonly list: HTMLElement;
  private _settings: Settings;
  private _poll: Poll;

  constructor(options: IPolledSectionOptions) {
    super();
    this._settings = options.settings;
    this.id = `jp-PodmanHpc-${options.name}`;
    this.addClass('jp-PodmanHpc-section');
    this.addClass(`jp-PodmanHpc-${options.name}Section`);
    this.title.label = options.label;
    this.toolbar.addItem(
      'refresh',
      new ToolbarButton({
        icon: refreshIcon,
        tooltip: `Refresh the ${options.label.toLowerCase()} now`,
        onClick: () => void this.refresh()
      })
    );
    this.status = h('div', { class: 'jp-PodmanHpc-status', role: 'status', 'aria-live': 'polite' });
    this.list = h('ul', { class: 'jp-PodmanHpc-jobList', 'aria-label': options.listLabel });
    this.addWidget(new Widget({ node: h('div', { class: 'jp-PodmanHpc-sectionBody' }, this.status, this.list) }));
    this._poll = new Poll({
      auto: false,
      factory: () => this.fetch(),
      frequency: this._frequency(),
      standby: () => !this.isVisible || 'when-hidden',
      name: `jupyter-podman-hpc:${options.name}`
    });
    options.settings.changed.connect(this._followSettings, this);
  }

  /** GET the list and show it; throws (after saying why in the status line) when it cannot. */
  protected abstract fetch(): Promise<void>;

  /** Refresh now; a failure is shown in the status line. */
  async refresh(): Promise<void> {
    try {
      await this.fetch();
    } catch {
      // shown in the status line
    }
  }

  /** The status line's text; an error is marked as one. */
  protected showStatus(message: string, error = false): void {
    setText(this.status, message);
    this.status.classList.toggle('jp-mod-error', error);
  }

  protected onAfterShow(): void {
    this._shown();
  }

  protected onAfterAttach(): void {
    this._shown();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._settings.changed.disconnect(this._followSettings, this);
    this._poll.dispose();
    super.dispose();
  }

  private _followSettings(): void {
    this._poll.frequency = this._frequency();
  }

  private _frequency() {
    const seconds = Math.max(1, this._settings.current.refreshInterval || 5);
    return { interval: seconds * 1000, backoff: true, max: Math.max(60_000, seconds * 1000) };
  }

  /** Start polling when first shown; refresh at once when shown again. */
  private _shown(): void {
    if (this._poll.isDisposed || !this.isVisible) {
      return;
    }
    if (this._poll.state.phase === 'constructed') {
      void this._poll.start();
    } else {
      void this.refresh();
    }
  }
}
