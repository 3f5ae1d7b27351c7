/**
 * The background tasks a section of the Containers panel follows (the Images
 * section's pulls and squashes, the Builds section's builds): one TaskView per
 * task, newest first, each kept until the user dismisses it.
 */

import { ITask } from './api';
import { TaskView } from './taskview';
import { h } from './util';

export interface ITaskListOptions {
  /** What the list holds, for screen readers. */
  label: string;
  /** Called once for each task that succeeded, with its final record. */
  onSucceeded: (task: ITask) => void;
  /** Show each task's log open (builds) or folded (pulls, squashes). */
  logOpen?: boolean;
  /** Scroll a new task into view (builds). */
  reveal?: boolean;
}

export class TaskList {
  readonly node: HTMLElement;
  private _options: ITaskListOptions;
  private _views = new Map<string, TaskView>();

  constructor(options: ITaskListOptions) {
    this._options = options;
    this.node = h('ul', { class: 'jp-PodmanHpc-tasks', 'aria-label': options.label });
  }

  /** Show a task at the top and follow it; a task already shown keeps its view. */
  follow(task: ITask): TaskView {
    const existing = this._views.get(task.id);
    if (existing) {
      return existing;
    }
    const view = new TaskView({
      task,
      logOpen: this._options.logOpen,
      onDone: finished => {
        if (finished.state === 'succeeded') {
          this._options.onSucceeded(finished);
        }
      },
      onDismiss: v => {
        v.dispose();
        this._views.delete(v.id);
      }
    });
    this._views.set(task.id, view);
    this.node.prepend(view.node);
    if (this._options.reveal) {
      view.node.scrollIntoView({ block: 'nearest' });
    }
    return view;
  }

  dispose(): void {
    for (const view of this._views.values()) {
      view.dispose();
    }
  }
}
