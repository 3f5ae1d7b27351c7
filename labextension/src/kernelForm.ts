/**
 * The "Make kernel" dialog's form: the name in the Launcher and the warm pool
 * size (kernels kept started ahead of need; kernels/pool.py on the server).
 */

import { Widget } from '@lumino/widgets';

import { h } from './util';

/** The most pooled kernels per kernelspec (kernels/kernelspec.py MAX_POOL). */
export const MAX_POOL = 16;

export interface IKernelRequest {
  displayName?: string;
  pool?: number;
}

let counter = 0;

export class KernelForm extends Widget {
  private _name: HTMLInputElement;
  private _pool: HTMLInputElement;

  constructor(ref: string) {
    super();
    this.addClass('jp-PodmanHpc-kernelForm');
    const id = `jp-PodmanHpc-kernel-${++counter}`;
    this._name = h('input', {
      id: `${id}-name`,
      name: 'display_name',
      type: 'text',
      class: 'jp-mod-styled',
      value: `Python (podman-hpc: ${ref})`
    });
    this._pool = h('input', {
      id: `${id}-pool`,
      name: 'pool',
      type: 'number',
      class: 'jp-mod-styled',
      min: 0,
      max: MAX_POOL,
      step: 1,
      value: 0
    });
    this.node.append(
      h(
        'div',
        { class: 'jp-PodmanHpc-formGrid' },
        h(
          'div',
          { class: 'jp-PodmanHpc-field', 'data-field': 'display_name' },
          h('label', { for: `${id}-name` }, 'Name in the Launcher'),
          h('div', { class: 'jp-PodmanHpc-control' }, this._name)
        ),
        h(
          'div',
          { class: 'jp-PodmanHpc-field', 'data-field': 'pool' },
          h('label', { for: `${id}-pool` }, 'Kept ready'),
          h(
            'div',
            { class: 'jp-PodmanHpc-control' },
            this._pool,
            h(
              'div',
              { class: 'jp-PodmanHpc-hint' },
              'Kernels started ahead of need in each server (a warm pool): a new kernel is ready at once.'
            )
          )
        )
      )
    );
  }

  /** The name (undefined: the default) and the pool size, clamped to 0..MAX_POOL. */
  getValue(): IKernelRequest {
    const pool = Math.round(Number(this._pool.value));
    return {
      displayName: this._name.value.trim() || undefined,
      pool: Number.isFinite(pool) ? Math.min(Math.max(pool, 0), MAX_POOL) : 0
    };
  }
}
