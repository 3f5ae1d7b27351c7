/**
 * A notebook job's output notebook (GET jobs/{id}/output), shown read-only
 * in the main area: JupyterLab's own notebook view (a StaticNotebook: no
 * kernel, no editing, no saving) with every output rendered by the Lab's
 * renderers. While the job runs it is fetched again every refresh interval
 * when rank 0 has rewritten it, as its cells complete; a header says which
 * cell rank 0 is in, or which cell failed on which rank.
 *
 * The output notebook is written inside the job's containers, so the image's
 * code may have written it: every cell is shown untrusted, as JupyterLab shows
 * a notebook it did not execute (HTML sanitised, no script run).
 */

import { MainAreaWidget } from '@jupyterlab/apputils';
import { IEditorServices } from '@jupyterlab/codeeditor';
import { NotebookModel, StaticNotebook } from '@jupyterlab/notebook';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { refreshIcon } from '@jupyterlab/ui-components';
import { Panel, Widget } from '@lumino/widgets';

import { api, IJob, IJobOutput } from './api';
import { IShell, JobPoll, JobViews } from './jobview';
import { button, h, messageOf, setText } from './util';

/** One line on rank 0's progress: where it is, or which cell failed on which rank. */
export function describeProgress(output: IJobOutput | null | undefined): string {
  const progress = output?.progress;
  if (!progress) {
    return output && !output.exists ? 'not started' : '';
  }
  if (progress.errors?.length) {
    return progress.errors.map(e => `cell ${e.cell} failed on rank ${e.rank}: ${e.ename}`).join('; ');
  }
  if (progress.state === 'running' && progress.cell) {
    return `running cell ${progress.cell} of ${progress.cells}`;
  }
  return progress.state ?? '';
}

/**
 * ``content`` (a notebook) with no cell's ``metadata.trusted``. JupyterLab
 * creates a cell model trusted when that flag is set, and a StaticNotebook
 * renders each cell as soon as its model is created, so the flag must be gone
 * before the notebook model sees the JSON: an untrusted flag set afterwards
 * comes too late for scripts already run.
 */
export function withoutTrust(content: any): any {
  const cells: any[] = Array.isArray(content?.cells) ? content.cells : [];
  return {
    ...content,
    cells: cells.map(cell => {
      const metadata = { ...cell?.metadata };
      delete metadata.trusted;
      return { ...cell, metadata };
    })
  };
}

export interface IOutputServices {
  rendermime: IRenderMimeRegistry;
  editorServices: IEditorServices;
}

export class OutputNotebookView extends Panel {
  private _jobId: string;
  private _header: HTMLElement;
  private _status: HTMLElement;
  private _notebook: StaticNotebook;
  private _poll: JobPoll;
  private _modified: number | null = null;
  private _finished = false;

  constructor(job: IJob, services: IOutputServices, refreshInterval: number) {
    super();
    this._jobId = job.id;
    this.addClass('jp-PodmanHpc-output');
    this._status = h('span', { class: 'jp-PodmanHpc-outputStatus', role: 'status', 'aria-live': 'polite' });
    this._header = h(
      'div',
      { class: 'jp-PodmanHpc-outputHeader' },
      h('span', { class: 'jp-PodmanHpc-outputTitle' }, `${job.output?.name ?? 'output'} · job ${job.id} (read-only)`),
      this._status,
      button('Refresh', () => void this.refresh(), { icon: refreshIcon, iconOnly: true })
    );
    this.addWidget(new Widget({ node: this._header }));
    this._notebook = new StaticNotebook({
      rendermime: services.rendermime,
      mimeTypeService: services.editorServices.mimeTypeService,
      contentFactory: new StaticNotebook.ContentFactory({
        editorFactory: services.editorServices.factoryService.newInlineEditor
      }),
      notebookConfig: { ...StaticNotebook.defaultNotebookConfig, windowingMode: 'none' }
    });
    this._notebook.addClass('jp-PodmanHpc-outputNotebook');
    this._notebook.model = new NotebookModel();
    this.addWidget(this._notebook);
    this._poll = new JobPoll({
      name: `output-${job.id}`,
      refreshInterval,
      refresh: () => this._refresh(),
      finished: () => this._finished
    });
  }

  /** Fetch the job and, if rank 0 rewrote it, its output notebook (errors are shown in the header). */
  refresh(): Promise<void> {
    return this._poll.refresh();
  }

  private async _refresh(): Promise<void> {
    let job: IJob;
    try {
      job = await api.job(this._jobId);
    } catch (error) {
      setText(this._status, messageOf(error));
      throw error;
    }
    this._finished = !!job.status?.finished;
    const output = job.output;
    const state = describeProgress(output);
    setText(this._status, [job.status?.state, state].filter(Boolean).join(' · '));
    this.node.dataset.state = output?.progress?.state ?? '';
    if (!output?.exists || output.modified === this._modified) {
      return;
    }
    const fetched = await api.jobOutput(this._jobId);
    this._modified = fetched.modified;
    const model = this._notebook.model as NotebookModel;
    model.fromJSON(withoutTrust(fetched.content));
    // and every cell model untrusted too, whatever else a later JupyterLab derives trust from
    for (const cell of model.cells) {
      cell.trusted = false;
    }
    model.dirty = false;
    for (const cell of this._notebook.widgets) {
      cell.readOnly = true;
    }
  }

  dispose(): void {
    this._poll.dispose();
    super.dispose();
  }
}

const openOutputs = new JobViews<OutputNotebookView>('output');

/** Open (or show again) the output notebook of a job. */
export function openJobOutput(
  shell: IShell,
  job: IJob,
  services: IOutputServices,
  refreshInterval: number
): MainAreaWidget<OutputNotebookView> {
  return openOutputs.open(shell, job, () => new OutputNotebookView(job, services, refreshInterval), {
    label: job.output?.name ?? `Job ${job.id} output`,
    caption: `The output notebook of job ${job.id}, read-only (${job.output?.path ?? job.directory})`
  });
}
