/**
 * A background task (pull, squash, build) as the panel shows it: state,
 * the current stage, one byte-progress bar per layer for pulls, the step
 * bar ("STEP 3/7: ...") for builds, the squash bar, the live log, and
 * Cancel (DELETE tasks/{id}) while it runs. Fed by `watchTask`.
 */

import { showErrorMessage } from '@jupyterlab/apputils';
import { closeIcon } from '@jupyterlab/ui-components';

import { api, FINISHED_TASK_STATES, IProgress, ITask, ITaskWatch, watchTask } from './api';
import { button, formatBytes, h, messageOf, setAttr, setText } from './util';

const MAX_LOG_LINES = 2000;
const STEP = /^STEP (\d+)\/(\d+)/;

/** A progress bar; a null fraction shows an indeterminate one. */
export class Bar {
  readonly node: HTMLElement;
  private _fill: HTMLElement;

  constructor(label: string) {
    this._fill = h('div', { class: 'jp-PodmanHpc-barFill' });
    this.node = h(
      'div',
      {
        class: 'jp-PodmanHpc-bar jp-mod-indeterminate',
        role: 'progressbar',
        'aria-label': label,
        'aria-valuemin': 0,
        'aria-valuemax': 100
      },
      this._fill
    );
  }

  set(fraction: number | null): void {
    const indeterminate = fraction === null || !isFinite(fraction);
    this.node.classList.toggle('jp-mod-indeterminate', indeterminate);
    if (indeterminate) {
      this.node.removeAttribute('aria-valuenow');
      this._fill.style.width = '';
      return;
    }
    const percent = Math.round(Math.max(0, Math.min(1, fraction)) * 100);
    setAttr(this.node, 'aria-valuenow', String(percent));
    this._fill.style.width = `${percent}%`;
  }
}

export interface ITaskViewOptions {
  task: ITask;
  /** Called once when the task has finished, with its final record. */
  onDone?: (task: ITask) => void;
  /** Called when the user dismisses a finished task. */
  onDismiss?: (view: TaskView) => void;
  /** Show the log open (builds) or folded (pulls, squashes). */
  logOpen?: boolean;
}

export class TaskView {
  readonly node: HTMLElement;
  readonly id: string;
  private _options: ITaskViewOptions;
  private _badge: HTMLElement;
  private _message: HTMLElement;
  private _stages: HTMLElement;
  private _layers: HTMLElement;
  private _layerBars = new Map<string, { bar: Bar; bytes: HTMLElement; row: HTMLElement }>();
  private _stageBars = new Map<string, { bar: Bar; label: HTMLElement; row: HTMLElement }>();
  private _log: HTMLElement;
  private _logBox: HTMLDetailsElement;
  private _logCount: HTMLElement;
  private _lines = 0;
  private _error: HTMLElement;
  private _cancel: HTMLButtonElement;
  private _dismiss: HTMLButtonElement;
  private _watch: ITaskWatch | null = null;
  private _state: string;
  private _done = false;

  constructor(options: ITaskViewOptions) {
    this._options = options;
    const task = options.task;
    this.id = task.id;
    this._state = task.state;
    this._badge = h('span', { class: 'jp-PodmanHpc-badge', 'data-state': task.state }, task.state);
    this._cancel = button('Cancel', () => void this.cancel(), {
      title: `Cancel ${task.title}`,
      className: 'jp-PodmanHpc-cancelTask'
    });
    this._dismiss = button('Dismiss', () => this._options.onDismiss?.(this), {
      icon: closeIcon,
      iconOnly: true,
      className: 'jp-PodmanHpc-dismissTask'
    });
    this._dismiss.hidden = true;
    this._message = h('div', { class: 'jp-PodmanHpc-taskMessage' }, '\u00a0');
    this._stages = h('div', { class: 'jp-PodmanHpc-stages' });
    this._layers = h('div', { class: 'jp-PodmanHpc-layers' });
    this._log = h('pre', { class: 'jp-PodmanHpc-log', tabindex: 0, 'aria-label': `Log of ${task.title}` });
    this._logCount = h('span', { class: 'jp-PodmanHpc-logCount' });
    this._logBox = h(
      'details',
      { class: 'jp-PodmanHpc-taskLog', open: options.logOpen ?? false },
      h('summary', {}, 'Log ', this._logCount),
      this._log
    );
    this._error = h('div', { class: 'jp-PodmanHpc-taskError', role: 'alert', hidden: true });
    this.node = h(
      'li',
      {
        class: 'jp-PodmanHpc-task',
        'data-task-id': task.id,
        'data-kind': task.kind,
        'data-state': task.state
      },
      h(
        'div',
        { class: 'jp-PodmanHpc-taskHeader' },
        this._badge,
        h('span', { class: 'jp-PodmanHpc-taskTitle', title: task.title }, task.title),
        this._cancel,
        this._dismiss
      ),
      this._message,
      this._stages,
      this._layers,
      this._logBox,
      this._error
    );
    for (const line of task.log) {
      this._appendLog(line);
    }
    if (task.progress) {
      this._progress(task.progress);
    }
    this._setState(task.state, task.error);
    if (!FINISHED_TASK_STATES.includes(task.state)) {
      this.follow();
    } else {
      this._finish(task);
    }
  }

  get state(): string {
    return this._state;
  }

  get finished(): boolean {
    return FINISHED_TASK_STATES.includes(this._state);
  }

  /** Stream the task's events (from its first one: the log is rebuilt). */
  follow(): void {
    this._watch?.dispose();
    this._log.textContent = '';
    this._lines = 0;
    this._watch = watchTask(this.id, {
      state: (state, data) => this._setState(state, data.error ?? null),
      progress: progress => this._progress(progress),
      log: line => this._appendLog(line),
      done: task => this._finish(task),
      error: error => {
        this._showError(`Lost track of the task: ${messageOf(error)}`);
      }
    });
  }

  async cancel(): Promise<void> {
    this._cancel.disabled = true;
    setText(this._cancel.querySelector('.jp-PodmanHpc-buttonLabel')!, 'Cancelling…');
    try {
      await api.cancelTask(this.id);
    } catch (error) {
      this._cancel.disabled = false;
      setText(this._cancel.querySelector('.jp-PodmanHpc-buttonLabel')!, 'Cancel');
      void showErrorMessage('Cannot cancel the task', messageOf(error));
    }
  }

  dispose(): void {
    this._watch?.dispose();
    this._watch = null;
    this.node.remove();
  }

  private _setState(state: string, error: string | null): void {
    if (!state) {
      return;
    }
    this._state = state;
    setText(this._badge, state);
    setAttr(this._badge, 'data-state', state);
    setAttr(this.node, 'data-state', state);
    const finished = FINISHED_TASK_STATES.includes(state);
    this._cancel.hidden = finished;
    this._dismiss.hidden = !finished;
    if (error) {
      this._showError(error);
    }
    if (finished) {
      for (const { bar } of this._stageBars.values()) {
        if (state === 'succeeded') {
          bar.set(1);
        }
      }
    }
  }

  private _finish(task: ITask): void {
    if (this._done) {
      return;
    }
    this._done = true;
    this._setState(task.state, task.error);
    if (task.state === 'succeeded') {
      const result = task.result;
      const what = result?.image ?? task.title;
      setText(
        this._message,
        `${task.kind === 'build' ? 'Built' : task.kind === 'pull' ? 'Pulled' : 'Squashed'} ${what}` +
          (result?.squashed ? ' (squashed)' : '')
      );
      for (const { bar, bytes } of this._layerBars.values()) {
        bar.set(1);
        if (!bytes.textContent) {
          setText(bytes, 'done');
        }
      }
    } else if (task.state === 'cancelled') {
      setText(this._message, 'Cancelled');
    } else if (task.state === 'interrupted') {
      setText(this._message, 'Interrupted');
    } else if (task.state === 'failed') {
      setText(this._message, 'Failed');
      this._logBox.open = true;
    }
    this._options.onDone?.(task);
  }

  private _showError(message: string): void {
    setText(this._error, message);
    this._error.hidden = false;
  }

  private _progress(progress: IProgress): void {
    const stage = progress.stage || 'task';
    if (stage === 'pull' && progress.item) {
      this._layer(progress);
      if (progress.message) {
        setText(this._message, progress.message);
      }
      return;
    }
    if (progress.message) {
      setText(this._message, progress.message);
    }
    // one bar per stage: the build's steps, the squash, the pull as a whole
    let entry = this._stageBars.get(stage);
    if (!entry) {
      const label = h('span', { class: 'jp-PodmanHpc-stageLabel' });
      const bar = new Bar(`${stage} progress`);
      const row = h('div', { class: 'jp-PodmanHpc-stage', 'data-stage': stage }, label, bar.node);
      this._stages.append(row);
      entry = { bar, label, row };
      this._stageBars.set(stage, entry);
    }
    if (stage === 'build') {
      const step = STEP.exec(progress.message);
      if (step) {
        setText(entry.label, progress.message);
        entry.bar.set(parseInt(step[1], 10) / parseInt(step[2], 10));
      } else if (progress.fraction !== null) {
        setText(entry.label, progress.message || 'build');
        entry.bar.set(progress.fraction);
      }
      return;
    }
    const name = stage.charAt(0).toUpperCase() + stage.slice(1);
    if (progress.fraction !== null && progress.fraction !== undefined) {
      setText(entry.label, `${name}: ${Math.round(progress.fraction * 100)}%`);
      entry.bar.set(progress.fraction);
    } else {
      setText(entry.label, name);
    }
  }

  private _layer(progress: IProgress): void {
    let entry = this._layerBars.get(progress.item);
    if (!entry) {
      const bar = new Bar(`layer ${progress.item}`);
      const bytes = h('span', { class: 'jp-PodmanHpc-layerBytes' });
      const row = h(
        'div',
        { class: 'jp-PodmanHpc-layer', 'data-layer': progress.item },
        h('span', { class: 'jp-PodmanHpc-layerName', title: progress.item }, progress.item.slice(0, 12)),
        bar.node,
        bytes
      );
      this._layers.append(row);
      entry = { bar, bytes, row };
      this._layerBars.set(progress.item, entry);
    }
    const done = /complete|exists/i.test(progress.message);
    if (done) {
      entry.bar.set(1);
      setText(entry.bytes, /exists/i.test(progress.message) ? 'exists' : formatBytes(progress.total) || 'done');
    } else if (progress.current !== null && progress.total) {
      entry.bar.set(progress.current / progress.total);
      setText(entry.bytes, `${formatBytes(progress.current)} / ${formatBytes(progress.total)}`);
    } else {
      entry.bar.set(null);
    }
  }

  private _appendLog(line: string): void {
    const stick = this._log.scrollTop + this._log.clientHeight >= this._log.scrollHeight - 4;
    this._log.append(line.endsWith('\n') ? line : line + '\n');
    this._lines++;
    while (this._lines > MAX_LOG_LINES && this._log.firstChild) {
      this._log.firstChild.remove();
      this._lines--;
    }
    setText(this._logCount, `(${this._lines} line${this._lines === 1 ? '' : 's'})`);
    if (stick) {
      this._log.scrollTop = this._log.scrollHeight;
    }
  }
}
