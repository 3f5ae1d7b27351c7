/**
 * What a job's views in the main area (its logs, its output notebook) share:
 * a poll that refreshes a view while its job runs, and one open view per job
 * and kind (opening it again brings it forward and refreshes it).
 */

import { MainAreaWidget } from '@jupyterlab/apputils';
import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { IJob } from './api';
import { scaleIcon } from './icons';

export interface IJobPollOptions {
  /** Names the poll: `jupyter-podman-hpc:<name>`. */
  name: string;
  /** Seconds between refreshes (at least 1). */
  refreshInterval: number;
  /** Fetch and show the job; throws (after the view said why) when it cannot. */
  refresh: () => Promise<void>;
  /** Whether the last refresh saw the job finished: the poll then stands by (refresh() still works). */
  finished: () => boolean;
}

/**
 * Refreshes a job's view every refreshInterval seconds until the job has
 * finished, backing off while the server fails and standing by while hidden.
 */
export class JobPoll {
  private _options: IJobPollOptions;
  private _poll: Poll;

  constructor(options: IJobPollOptions) {
    this._options = options;
    this._poll = new Poll({
      factory: () => options.refresh(),
      frequency: { interval: Math.max(1, options.refreshInterval) * 1000, backoff: true, max: 60_000 },
      standby: () => options.finished() || 'when-hidden',
      name: `jupyter-podman-hpc:${options.name}`
    });
  }

  /** Refresh now; a failure is shown by the view. */
  async refresh(): Promise<void> {
    try {
      await this._options.refresh();
    } catch {
      // shown by the view
    }
  }

  dispose(): void {
    this._poll.dispose();
  }
}

/** Where views open: JupyterLab's shell. */
export interface IShell {
  add: (widget: Widget, area: string) => void;
  activateById: (id: string) => void;
}

/** A view of a job that can be refreshed on demand. */
export interface IJobView extends Widget {
  refresh(): Promise<void>;
}

export interface IJobViewTitle {
  label: string;
  caption: string;
}

/** The open views of one kind (`logs`, `output`), one per job. */
export class JobViews<T extends IJobView> {
  private _kind: string;
  private _open = new Map<string, MainAreaWidget<T>>();

  constructor(kind: string) {
    this._kind = kind;
  }

  /** Open a job's view in the main area, or bring forward and refresh the one open. */
  open(shell: IShell, job: IJob, create: () => T, title: IJobViewTitle): MainAreaWidget<T> {
    const id = `jp-PodmanHpc-${this._kind}-main-${job.id}`;
    const widget = this._open.get(id);
    if (widget && !widget.isDisposed) {
      shell.activateById(id);
      void widget.content.refresh();
      return widget;
    }
    const main = new MainAreaWidget({ content: create() });
    main.id = id;
    main.title.label = title.label;
    main.title.caption = title.caption;
    main.title.icon = scaleIcon;
    main.title.closable = true;
    this._open.set(id, main);
    main.disposed.connect(() => this._open.delete(id));
    shell.add(main, 'main');
    shell.activateById(id);
    return main;
  }
}
