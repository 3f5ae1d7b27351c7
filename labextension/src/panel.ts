/**
 * The "Containers" side panel: three sections of a JupyterLab SidePanel.
 *
 * - Images (GET images): each image with its squashed badge, size and
 *   stores; pull (POST images/pull), squash (POST images/squash), remove
 *   squashed (DELETE images/squashed/{image}), make kernel (POST kernels);
 *   the tasks of pulls and squashes with live progress.
 * - Builds (POST images/build): live log and step progress, Cancel.
 * - Jobs (GET jobs every refreshInterval seconds): state badges, nodes,
 *   elapsed time, exit code, the cell rank 0 of a notebook job is in (or
 *   which cell failed on which rank); logs, "Open output" (the output
 *   notebook, read-only), cancel (DELETE jobs/{id}), directory.
 * - Clusters (clusters.ts): running interactive clusters, their engines, Stop.
 *
 * Rows are keyed by id and updated in place, so polling neither flickers
 * nor moves what the user is looking at (or has focused).
 */

import { Dialog, Notification, showDialog, showErrorMessage } from '@jupyterlab/apputils';
import { buildIcon, PanelWithToolbar, refreshIcon, SidePanel, ToolbarButton } from '@jupyterlab/ui-components';
import { AccordionPanel, Widget } from '@lumino/widgets';

import { api, FINISHED_TASK_STATES, IBuildRequest, IContainerKernel, IImage, IJob, ITask } from './api';
import { ClustersSection } from './clusters';
import { PolledSection } from './polled';
import { containersIcon } from './icons';
import { KernelForm } from './kernelForm';
import { jobLabel } from './logs';
import { describeProgress } from './output';
import { Settings } from './settings';
import { TaskList } from './tasklist';
import { TaskView } from './taskview';
import { button, formatBytes, formatElapsed, h, messageOf, reconcileRows, setAttr, setText } from './util';

export const PANEL_ID = 'jp-PodmanHpc-panel';

export interface IPanelOptions {
  settings: Settings;
  /** Open the logs viewer of a job. */
  openLogs: (job: IJob) => void;
  /** Open the output notebook of a notebook job (read-only). */
  openOutput: (job: IJob) => void;
  /** Show a job's directory (in the file browser when it is inside the server root). */
  openDirectory: (job: IJob) => void;
  /** A kernelspec was installed: make the Launcher show it. */
  kernelInstalled: (kernel: IContainerKernel) => Promise<void>;
  /** Ask for a build (the dialog), with a Containerfile proposed when one is selected. */
  askBuild: () => Promise<IBuildRequest | null>;
}

/** A status line of fixed height: errors of a refresh, or an empty list. */
function statusLine(): HTMLElement {
  return h('div', { class: 'jp-PodmanHpc-status', role: 'status', 'aria-live': 'polite' });
}

function showStatus(node: HTMLElement, message: string, error = false): void {
  setText(node, message);
  node.classList.toggle('jp-mod-error', error);
}

/** The image reference to act on: its first name, else its id. */
function reference(image: IImage): string {
  return image.names[0] ?? image.id;
}

// --- Images ----------------------------------------------------------------------

class ImageRow {
  readonly node: HTMLElement;
  image: IImage;
  private _name: HTMLElement;
  private _others: HTMLElement;
  private _badge: HTMLElement;
  private _meta: HTMLElement;
  private _squash: HTMLButtonElement;
  private _remove: HTMLButtonElement;
  private _kernel: HTMLButtonElement;

  constructor(image: IImage, section: ImagesSection) {
    this.image = image;
    this._name = h('span', { class: 'jp-PodmanHpc-imageName' });
    this._others = h('span', { class: 'jp-PodmanHpc-imageOthers' });
    this._badge = h(
      'span',
      { class: 'jp-PodmanHpc-badge jp-PodmanHpc-squashedBadge', 'data-state': 'squashed' },
      'squashed'
    );
    this._meta = h('div', { class: 'jp-PodmanHpc-imageMeta' });
    this._squash = button('Squash', () => void section.squash(this.image), {
      className: 'jp-PodmanHpc-squashImage'
    });
    this._remove = button('Remove squashed', () => void section.removeSquashed(this.image), {
      className: 'jp-PodmanHpc-removeSquashed'
    });
    this._kernel = button('Make kernel', () => void section.makeKernel(this.image), {
      className: 'jp-PodmanHpc-makeKernel'
    });
    this.node = h(
      'li',
      { class: 'jp-PodmanHpc-image', 'data-image-id': image.id },
      h('div', { class: 'jp-PodmanHpc-imageHeader' }, this._name, this._others),
      h('div', { class: 'jp-PodmanHpc-imageDetails' }, this._badge, this._meta),
      h('div', { class: 'jp-PodmanHpc-actions' }, this._squash, this._remove, this._kernel)
    );
    this.update(image);
  }

  update(image: IImage): void {
    this.image = image;
    const name = image.names[0] ?? `<none> (${image.short_id})`;
    setText(this._name, name);
    setAttr(this._name, 'title', image.names.join('\n') || image.id);
    setText(this._others, image.names.length > 1 ? `+${image.names.length - 1}` : '');
    setAttr(this.node, 'data-image', image.names[0] ?? '');
    setAttr(this.node, 'data-squashed', String(image.squashed));
    this._badge.hidden = !image.squashed;
    setText(this._meta, [image.short_id, formatBytes(image.size), image.stores].filter(Boolean).join(' · '));
    this._squash.hidden = image.squashed || !image.local;
    this._remove.hidden = !image.squashed;
    this._kernel.disabled = !image.names.length;
    const ref = reference(image);
    setAttr(this._squash, 'title', `Squash ${ref} into the squashed store (compute nodes run it from there)`);
    setAttr(this._remove, 'title', `Remove ${ref} from the squashed store`);
    setAttr(this._kernel, 'title', `Install a Jupyter kernel that runs in ${ref}`);
  }
}

export class ImagesSection extends PanelWithToolbar {
  private _options: IPanelOptions;
  private _list: HTMLElement;
  private _tasks: TaskList;
  private _status: HTMLElement;
  private _rows = new Map<string, ImageRow>();
  private _input: HTMLInputElement;
  private _squashAfterPull: HTMLInputElement;
  private _loaded = false;
  private _refreshing: Promise<void> | null = null;

  constructor(options: IPanelOptions) {
    super();
    this._options = options;
    this.id = 'jp-PodmanHpc-images';
    this.addClass('jp-PodmanHpc-section');
    this.addClass('jp-PodmanHpc-imagesSection');
    this.title.label = 'Images';
    this.toolbar.addItem(
      'refresh',
      new ToolbarButton({
        icon: refreshIcon,
        tooltip: 'Refresh the images',
        onClick: () => void this.refresh()
      })
    );

    this._input = h('input', {
      type: 'text',
      name: 'pull',
      class: 'jp-mod-styled jp-PodmanHpc-pullInput',
      placeholder: 'registry/name:tag',
      'aria-label': 'Image reference to pull',
      spellcheck: 'false'
    });
    this._squashAfterPull = h('input', { type: 'checkbox', name: 'squash', checked: true });
    const form = h(
      'form',
      { class: 'jp-PodmanHpc-pullForm', 'aria-label': 'Pull an image' },
      h(
        'div',
        { class: 'jp-PodmanHpc-pullRow' },
        this._input,
        h('button', { type: 'submit', class: 'jp-PodmanHpc-button jp-mod-accept jp-PodmanHpc-pullButton' }, 'Pull')
      ),
      h('label', { class: 'jp-PodmanHpc-checkbox' }, this._squashAfterPull, ' squash after pulling')
    );
    form.addEventListener('submit', event => {
      event.preventDefault();
      void this.pull(this._input.value);
    });
    this._tasks = new TaskList({ label: 'Pulls and squashes', onSucceeded: () => void this.refresh() });
    this._status = statusLine();
    this._list = h('ul', { class: 'jp-PodmanHpc-imageList', 'aria-label': 'Images' });
    const body = new Widget({
      node: h('div', { class: 'jp-PodmanHpc-sectionBody' }, form, this._tasks.node, this._status, this._list)
    });
    this.addWidget(body);
  }

  protected onAfterShow(): void {
    if (!this._loaded) {
      void this.refresh();
    }
  }

  protected onAfterAttach(): void {
    if (this.isVisible && !this._loaded) {
      void this.refresh();
    }
  }

  /** GET images; rows updated in place. */
  refresh(): Promise<void> {
    if (!this._refreshing) {
      this._refreshing = this._refresh().finally(() => {
        this._refreshing = null;
      });
    }
    return this._refreshing;
  }

  private async _refresh(): Promise<void> {
    if (!this._loaded) {
      showStatus(this._status, 'Loading images…');
    }
    let images: IImage[];
    try {
      images = await api.images();
    } catch (error) {
      showStatus(this._status, `Cannot list the images: ${messageOf(error)}`, true);
      return;
    }
    this._loaded = true;
    // the server's order
    reconcileRows(
      this._list,
      this._rows,
      images,
      image => image.id,
      image => new ImageRow(image, this)
    );
    showStatus(this._status, images.length ? '' : 'No images yet: pull or build one.');
  }

  /** Pull an image (POST images/pull) and follow its task. */
  async pull(reference: string): Promise<void> {
    const ref = reference.trim();
    if (!ref) {
      this._input.focus();
      showStatus(this._status, 'Give an image reference to pull, e.g. registry.example.org/team/image:tag.', true);
      return;
    }
    try {
      const task = await api.pull(ref, this._squashAfterPull.checked);
      this._input.value = '';
      showStatus(this._status, '');
      this.follow(task);
    } catch (error) {
      showStatus(this._status, `Cannot pull ${ref}: ${messageOf(error)}`, true);
    }
  }

  async squash(image: IImage): Promise<void> {
    const ref = reference(image);
    try {
      this.follow(await api.squash(ref));
    } catch (error) {
      void showErrorMessage(`Cannot squash ${ref}`, messageOf(error));
    }
  }

  async removeSquashed(image: IImage): Promise<void> {
    const ref = reference(image);
    const answer = await showDialog({
      title: 'Remove squashed image',
      body: `Remove ${ref} from the squashed store? Jobs can no longer run it until it is squashed again.`,
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Remove' })]
    });
    if (!answer.button.accept) {
      return;
    }
    try {
      await api.removeSquashed(ref);
      Notification.success(`Removed ${ref} from the squashed store`, { autoClose: 4000 });
    } catch (error) {
      void showErrorMessage(`Cannot remove ${ref} from the squashed store`, messageOf(error));
    }
    await this.refresh();
  }

  async makeKernel(image: IImage): Promise<void> {
    const ref = reference(image);
    const answer = await showDialog({
      title: `Make a kernel from ${ref}`,
      body: new KernelForm(ref),
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Make kernel' })]
    });
    if (!answer.button.accept || !answer.value) {
      return;
    }
    const { displayName, pool } = answer.value;
    try {
      const kernel = await api.installKernel(ref, displayName, [], pool);
      await this._options.kernelInstalled(kernel);
      Notification.success(`Kernel “${kernel.display_name}” installed: it is in the Launcher`, {
        autoClose: 5000
      });
    } catch (error) {
      void showErrorMessage(`Cannot make a kernel from ${ref}`, messageOf(error));
    }
  }

  /** Show a pull or squash task and follow it; the list is refreshed when it succeeds. */
  follow(task: ITask): TaskView {
    return this._tasks.follow(task);
  }

  dispose(): void {
    this._tasks.dispose();
    super.dispose();
  }
}

// --- Builds ----------------------------------------------------------------------

export class BuildsSection extends PanelWithToolbar {
  onBuilt: (task: ITask) => void = () => undefined;
  private _options: IPanelOptions;
  private _tasks: TaskList;
  private _status: HTMLElement;

  constructor(options: IPanelOptions) {
    super();
    this._options = options;
    this.id = 'jp-PodmanHpc-builds';
    this.addClass('jp-PodmanHpc-section');
    this.addClass('jp-PodmanHpc-buildsSection');
    this.title.label = 'Builds';
    this.toolbar.addItem(
      'build',
      new ToolbarButton({
        icon: buildIcon,
        label: 'Build…',
        tooltip: 'Build an image from a Containerfile',
        onClick: () => void this.ask()
      })
    );
    this._status = statusLine();
    showStatus(this._status, 'Build an image: right-click a Containerfile in the file browser, or use Build….');
    this._tasks = new TaskList({
      label: 'Builds',
      logOpen: true,
      reveal: true,
      onSucceeded: task => this.onBuilt(task)
    });
    this.addWidget(
      new Widget({ node: h('div', { class: 'jp-PodmanHpc-sectionBody' }, this._status, this._tasks.node) })
    );
  }

  async ask(): Promise<void> {
    const request = await this._options.askBuild();
    if (request) {
      await this.build(request);
    }
  }

  /** POST images/build and follow the build. */
  async build(request: IBuildRequest): Promise<TaskView | null> {
    try {
      const task = await api.build(request);
      showStatus(this._status, '');
      return this.follow(task);
    } catch (error) {
      void showErrorMessage(`Cannot build ${request.tag}`, messageOf(error));
      return null;
    }
  }

  /** Show a build and follow it (its log open); onBuilt is called when it succeeds. */
  follow(task: ITask): TaskView {
    return this._tasks.follow(task);
  }

  dispose(): void {
    this._tasks.dispose();
    super.dispose();
  }
}

// --- Jobs ------------------------------------------------------------------------

class JobRow {
  readonly node: HTMLElement;
  job: IJob;
  private _badge: HTMLElement;
  private _name: HTMLElement;
  private _nodes: HTMLElement;
  private _elapsed: HTMLElement;
  private _exit: HTMLElement;
  private _cancel: HTMLButtonElement;
  private _progress: HTMLElement;
  private _openOutput: HTMLButtonElement;

  constructor(job: IJob, section: JobsSection) {
    this.job = job;
    this._badge = h('span', { class: 'jp-PodmanHpc-badge jp-PodmanHpc-state' });
    this._name = h('span', { class: 'jp-PodmanHpc-jobName' });
    this._nodes = h('span', { class: 'jp-PodmanHpc-jobNodes' });
    this._elapsed = h('span', { class: 'jp-PodmanHpc-jobElapsed', title: 'Elapsed time' });
    this._exit = h('span', { class: 'jp-PodmanHpc-jobExit', title: 'Exit code' });
    this._progress = h('div', { class: 'jp-PodmanHpc-jobProgress', title: 'The output notebook: rank 0’s progress' });
    this._openOutput = button('Open output', () => section.output(this.job), {
      className: 'jp-PodmanHpc-jobOutput',
      title: 'Open the executed notebook (read-only; refreshed while the job runs)'
    });
    this._cancel = button('Cancel', () => void section.cancel(this.job), { className: 'jp-PodmanHpc-cancelJob' });
    this.node = h(
      'li',
      { class: 'jp-PodmanHpc-job', 'data-job-id': job.id, tabindex: -1 },
      h(
        'div',
        { class: 'jp-PodmanHpc-jobHeader' },
        this._badge,
        this._name,
        h('span', { class: 'jp-PodmanHpc-jobId' }, `#${job.id}`)
      ),
      h('div', { class: 'jp-PodmanHpc-jobMeta' }, this._nodes, this._elapsed, this._exit),
      this._progress,
      h(
        'div',
        { class: 'jp-PodmanHpc-actions' },
        button('Logs', () => section.logs(this.job), {
          className: 'jp-PodmanHpc-jobLogs',
          title: `Show the output of each rank of job ${job.id}`
        }),
        this._openOutput,
        this._cancel,
        button('Directory', () => section.directory(this.job), {
          className: 'jp-PodmanHpc-jobDirectory',
          title: job.directory
        })
      )
    );
    this.update(job);
  }

  update(job: IJob): void {
    this.job = job;
    const status = job.status;
    const state = status?.state ?? (job.id ? 'PENDING' : 'UNKNOWN');
    setText(this._badge, state);
    setAttr(this._badge, 'data-state', state.toLowerCase());
    setAttr(this.node, 'data-state', state);
    const reason = status?.reason && status.reason.toLowerCase() !== 'none' ? status.reason : '';
    setAttr(this._badge, 'title', reason ? `${status?.raw_state || state}: ${reason}` : status?.raw_state || state);
    setText(this._name, jobLabel(job));
    setAttr(this._name, 'title', `${job.name}\n${job.directory}`);
    const nodes = Number(job.spec?.nodes ?? status?.nodes?.length ?? 0);
    const tasks = Number(job.spec?.tasks_per_node ?? 1);
    setText(this._nodes, `${nodes} node${nodes === 1 ? '' : 's'} × ${tasks}`);
    setAttr(this._nodes, 'title', status?.nodelist ? `Nodes: ${status.nodelist}` : 'Not started yet');
    setText(this._elapsed, formatElapsed(status?.elapsed));
    const exit = status?.finished && status.exit_code !== null ? `exit ${status.exit_code}` : 'exit –';
    setText(this._exit, exit);
    this._exit.classList.toggle('jp-mod-error', !!status?.finished && status.exit_code !== 0);
    this._cancel.disabled = !!status?.finished;
    const output = job.output;
    this._openOutput.hidden = !output;
    this._openOutput.disabled = !output?.exists;
    this._progress.hidden = !output;
    setText(this._progress, output ? `${output.name}: ${describeProgress(output)}` : '');
    this._progress.classList.toggle('jp-mod-error', !!output?.progress?.errors?.length);
  }
}

export class JobsSection extends PolledSection {
  private _options: IPanelOptions;
  private _rows = new Map<string, JobRow>();
  private _loaded = false;
  private _selected: string | null = null;

  constructor(options: IPanelOptions) {
    super({ settings: options.settings, name: 'jobs', label: 'Jobs', listLabel: 'Slurm jobs' });
    this._options = options;
  }

  protected async fetch(): Promise<void> {
    if (!this._loaded) {
      this.showStatus('Loading jobs…');
    }
    let jobs: IJob[];
    try {
      jobs = await api.jobs();
    } catch (error) {
      this.showStatus(`Cannot list the jobs: ${messageOf(error)}`, true);
      throw error;
    }
    this._loaded = true;
    this._show(jobs);
    this.showStatus(jobs.length ? '' : 'No jobs yet: use “Run at scale” in a notebook.');
  }

  private _show(jobs: IJob[]): void {
    const keyOf = (job: IJob) => job.id || job.directory;
    reconcileRows(this.list, this._rows, jobs, keyOf, job => new JobRow(job, this));
    for (const [key, row] of this._rows) {
      row.node.classList.toggle('jp-mod-selected', key === this._selected);
    }
  }

  /** Show a job (just submitted): select it, scroll to it, refresh the list. */
  reveal(job: IJob): void {
    const key = job.id || job.directory;
    this._selected = key;
    let row = this._rows.get(key);
    if (!row) {
      row = new JobRow(job, this);
      this._rows.set(key, row);
      this.list.prepend(row.node);
      this.showStatus('');
    } else {
      row.update(job);
    }
    for (const [other, r] of this._rows) {
      r.node.classList.toggle('jp-mod-selected', other === key);
    }
    row.node.scrollIntoView({ block: 'nearest' });
    void this.refresh();
  }

  logs(job: IJob): void {
    this._options.openLogs(job);
  }

  output(job: IJob): void {
    this._options.openOutput(job);
  }

  directory(job: IJob): void {
    this._options.openDirectory(job);
  }

  async cancel(job: IJob): Promise<void> {
    const answer = await showDialog({
      title: `Cancel job ${job.id}`,
      body: `Cancel Slurm job ${job.id} (scancel)? Its ranks are stopped and their containers removed.`,
      buttons: [Dialog.cancelButton({ label: 'Keep it' }), Dialog.warnButton({ label: 'Cancel job' })]
    });
    if (!answer.button.accept) {
      return;
    }
    try {
      const updated = await api.cancelJob(job.id);
      this._rows.get(job.id)?.update(updated);
    } catch (error) {
      void showErrorMessage(`Cannot cancel job ${job.id}`, messageOf(error));
    }
    void this.refresh();
  }
}

// --- the panel ---------------------------------------------------------------------

export class ContainersPanel extends SidePanel {
  readonly images: ImagesSection;
  readonly builds: BuildsSection;
  readonly jobs: JobsSection;
  readonly clusters: ClustersSection;
  private _resumed = false;

  constructor(options: IPanelOptions) {
    super();
    this.id = PANEL_ID;
    this.addClass('jp-PodmanHpc-panel');
    this.title.icon = containersIcon;
    this.title.caption = 'Containers: images, builds and Slurm jobs (podman-hpc)';
    this.images = new ImagesSection(options);
    this.builds = new BuildsSection(options);
    this.jobs = new JobsSection(options);
    this.clusters = new ClustersSection(options.settings);
    this.builds.onBuilt = () => void this.images.refresh();
    this.addWidget(this.images);
    this.addWidget(this.builds);
    this.addWidget(this.jobs);
    this.addWidget(this.clusters);
  }

  protected onAfterShow(): void {
    this._resumeOnce();
  }

  protected onAfterAttach(): void {
    if (this.isVisible) {
      this._resumeOnce();
    }
  }

  private _resumeOnce(): void {
    if (!this._resumed) {
      this._resumed = true;
      void this._resume();
    }
  }

  /** Expand a section (Images, Builds or Jobs) of the accordion. */
  expand(section: Widget): void {
    const accordion = this.content as AccordionPanel;
    const index = accordion.widgets.indexOf(section);
    if (index >= 0 && !section.isVisible) {
      accordion.expand(index);
    }
  }

  /** Tasks survive a reload: follow those still running (once, when the panel is first shown). */
  private async _resume(): Promise<void> {
    let tasks: ITask[];
    try {
      tasks = await api.tasks();
    } catch {
      return; // the Images section shows what is wrong with the server
    }
    for (const task of tasks.reverse()) {
      if (FINISHED_TASK_STATES.includes(task.state)) {
        continue;
      }
      if (task.kind === 'build') {
        this.builds.follow(task);
      } else {
        this.images.follow(task);
      }
    }
  }
}
