/**
 * The logs of a job (GET jobs/{id}/logs): one section per rank with its
 * standard output and error, and Slurm's log of the batch script. Refreshed
 * while the job runs; sections are updated in place (folds and scroll stay).
 */

import { MainAreaWidget } from '@jupyterlab/apputils';
import { refreshIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { api, IJob, IJobLogs } from './api';
import { IShell, JobPoll, JobViews } from './jobview';
import { button, formatElapsed, h, messageOf, setAttr, setText } from './util';

/** What a job runs: its notebook's or script's name, else its record's name. */
export function jobLabel(job: IJob): string {
  const source = job.spec?.notebook ?? job.spec?.python_script;
  return typeof source === 'string' && source ? (source.split('/').pop() ?? source) : job.name;
}

interface ISection {
  node: HTMLDetailsElement;
  summary: HTMLElement;
  out: HTMLElement;
  errLabel: HTMLElement;
  err: HTMLElement;
}

export class JobLogsView extends Widget {
  private _job: IJob;
  private _header: HTMLElement;
  private _badge: HTMLElement;
  private _detail: HTMLElement;
  private _status: HTMLElement;
  private _ranks: HTMLElement;
  private _sections = new Map<string, ISection>();
  private _batch: ISection;
  private _poll: JobPoll;
  private _finished = false;

  constructor(job: IJob, refreshInterval: number) {
    super();
    this._job = job;
    this.addClass('jp-PodmanHpc-logs');
    this.id = `jp-PodmanHpc-logs-${job.id}`;
    this._badge = h('span', { class: 'jp-PodmanHpc-badge jp-PodmanHpc-state' });
    this._detail = h('span', { class: 'jp-PodmanHpc-logsDetail' });
    const refresh = button('Refresh', () => void this.refresh(), {
      icon: refreshIcon,
      iconOnly: true
    });
    this._header = h(
      'div',
      { class: 'jp-PodmanHpc-logsHeader' },
      h('span', { class: 'jp-PodmanHpc-logsTitle' }, `Job ${job.id}`, jobLabel(job) ? ` · ${jobLabel(job)}` : ''),
      this._badge,
      this._detail,
      refresh
    );
    this._status = h('div', { class: 'jp-PodmanHpc-status', role: 'status', 'aria-live': 'polite' }, 'Loading…');
    this._ranks = h('div', { class: 'jp-PodmanHpc-ranks', role: 'list', 'aria-label': 'Output of each rank' });
    this._batch = this._section('Batch script log (Slurm)', 'batch');
    this._batch.node.open = false;
    this.node.append(
      this._header,
      h('div', { class: 'jp-PodmanHpc-logsPath' }, 'Directory: ', h('code', {}, job.directory)),
      this._status,
      this._ranks,
      h('div', { class: 'jp-PodmanHpc-batch' }, this._batch.node)
    );
    this._showStatus(job);
    this._poll = new JobPoll({
      name: `logs-${job.id}`,
      refreshInterval,
      refresh: () => this._refresh(),
      finished: () => this._finished
    });
  }

  dispose(): void {
    this._poll.dispose();
    super.dispose();
  }

  /** Fetch the job's status and logs now (errors are shown in the status line). */
  refresh(): Promise<void> {
    return this._poll.refresh();
  }

  private async _refresh(): Promise<void> {
    let job: IJob;
    let logs: IJobLogs;
    try {
      [job, logs] = await Promise.all([api.job(this._job.id), api.jobLogs(this._job.id)]);
    } catch (error) {
      setText(this._status, `Cannot read the logs: ${messageOf(error)}`);
      this._status.classList.add('jp-mod-error');
      throw error;
    }
    this._status.classList.remove('jp-mod-error');
    this._job = job;
    this._showStatus(job);
    this._showLogs(logs);
    // the last refresh after the job ended collects the last output
    this._finished = !!job.status?.finished;
  }

  private _showStatus(job: IJob): void {
    const status = job.status;
    const state = status?.state ?? 'UNKNOWN';
    setText(this._badge, state);
    setAttr(this._badge, 'data-state', state.toLowerCase());
    const parts: string[] = [];
    if (status?.nodelist) {
      parts.push(`on ${status.nodelist}`);
    }
    if (status?.elapsed !== null && status?.elapsed !== undefined) {
      parts.push(`elapsed ${formatElapsed(status.elapsed)}`);
    }
    if (status?.finished && status.exit_code !== null) {
      parts.push(`exit code ${status.exit_code}`);
    }
    if (status?.reason && status.reason.toLowerCase() !== 'none') {
      parts.push(status.reason);
    }
    setText(this._detail, parts.join(' · '));
  }

  private _showLogs(logs: IJobLogs): void {
    const ranks = Object.keys({ ...logs.ranks, ...logs.errors }).sort((a, b) => parseInt(a, 10) - parseInt(b, 10));
    for (const rank of ranks) {
      let section = this._sections.get(rank);
      if (!section) {
        section = this._section(`Rank ${rank}`, rank);
        this._sections.set(rank, section);
        // keep the sections in rank order
        const after = [...this._sections.keys()]
          .filter(other => parseInt(other, 10) > parseInt(rank, 10))
          .sort((a, b) => parseInt(a, 10) - parseInt(b, 10))[0];
        const next = after !== undefined ? this._sections.get(after)?.node : null;
        this._ranks.insertBefore(section.node, next ?? null);
      }
      this._fill(section, logs.ranks[rank] ?? '', logs.errors[rank] ?? '');
    }
    this._fill(this._batch, logs.batch ?? '', '');
    const count = ranks.length;
    setText(
      this._status,
      count
        ? `${count} rank${count === 1 ? '' : 's'} wrote output`
        : this._job.status?.finished
          ? 'No rank wrote output.'
          : 'No output yet.'
    );
  }

  private _section(title: string, key: string): ISection {
    const summary = h('summary', {}, title);
    const out = h('pre', { class: 'jp-PodmanHpc-rankOut', tabindex: 0, 'aria-label': `${title} output` });
    const errLabel = h('div', { class: 'jp-PodmanHpc-rankErrLabel', hidden: true }, 'stderr');
    const err = h('pre', {
      class: 'jp-PodmanHpc-rankErr',
      tabindex: 0,
      hidden: true,
      'aria-label': `${title} errors`
    });
    const node = h(
      'details',
      {
        class: key === 'batch' ? 'jp-PodmanHpc-batchLog' : 'jp-PodmanHpc-rank',
        'data-rank': key,
        open: true,
        role: 'listitem'
      },
      summary,
      out,
      errLabel,
      err
    );
    return { node, summary, out, errLabel, err };
  }

  private _fill(section: ISection, out: string, err: string): void {
    setText(section.out, out || '(no output)');
    section.out.classList.toggle('jp-mod-empty', !out);
    setText(section.err, err);
    section.err.hidden = !err;
    section.errLabel.hidden = !err;
  }
}

const openLogs = new JobViews<JobLogsView>('logs');

/** Open (or bring forward) the logs of a job in the main area. */
export function openJobLogs(shell: IShell, job: IJob, refreshInterval: number): MainAreaWidget<JobLogsView> {
  return openLogs.open(shell, job, () => new JobLogsView(job, refreshInterval), {
    label: `Job ${job.id} logs`,
    caption: `Logs of job ${job.id} (${job.directory})`
  });
}
