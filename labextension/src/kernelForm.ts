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
      placeholder: "server's default"
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
              'Kernels started ahead of need in each server (a warm pool): a new kernel is ready at once. ' +
                "Empty: the server's default (one, unless your site set another); 0: each kernel starts on demand."
            )
          )
        )
      )
    );
  }

  /** The name and the pool size, clamped to 0..MAX_POOL (undefined: the server's default). */
  getValue(): IKernelRequest {
    const text = this._pool.value.trim();
    const pool = Math.round(Number(text));
    return {
      displayName: this._name.value.trim() || undefined,
      pool: text && Number.isFinite(pool) ? Math.min(Math.max(pool, 0), MAX_POOL) : undefined
    };
  }
}
