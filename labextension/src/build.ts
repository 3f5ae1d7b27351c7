/**
 * The "Build image" dialog: a tag, and the Containerfile as a file in the
 * server root (built with its directory as the context, as
 * `podman build -f dir/Containerfile dir`) or as text; squash afterwards.
 */

import { Dialog } from '@jupyterlab/apputils';
import { PathExt } from '@jupyterlab/coreutils';
import { Widget } from '@lumino/widgets';

import { IBuildRequest } from './api';
import { h, setText } from './util';

/** Containerfile, Dockerfile, Containerfile.gpu, app.Containerfile, ... */
export const CONTAINERFILE = /^(?:(?:containerfile|dockerfile)(?:\.[^/]*)?|[^/]*\.(?:containerfile|dockerfile))$/i;

/** The same names, as a pattern string for the document registry's file type. */
export const CONTAINERFILE_PATTERN =
  '^(?:(?:[Cc]ontainerfile|[Dd]ockerfile)(?:\\.[^/]*)?|[^/]*\\.(?:[Cc]ontainerfile|[Dd]ockerfile))$';

export function isContainerfile(path: string): boolean {
  return CONTAINERFILE.test(PathExt.basename(path));
}

/** A tag proposed for a Containerfile: localhost/<directory or file stem>:latest. */
export function defaultTag(path: string): string {
  const base = PathExt.basename(path);
  const dir = PathExt.basename(PathExt.dirname(path));
  let stem = base.replace(/\.?(containerfile|dockerfile)$/i, '').replace(/^(containerfile|dockerfile)\.?/i, '');
  if (!stem) {
    stem = dir || 'image';
  }
  const name =
    stem
      .toLowerCase()
      .replace(/[^a-z0-9._-]+/g, '-')
      .replace(/^[-._]+|[-._]+$/g, '') || 'image';
  return `localhost/${name}:latest`;
}

// the reference grammar, loosely: the server validates it exactly
const TAG =
  /^[a-z0-9]+(?:[._-][a-z0-9]+|[:.][0-9]+)*(?:\/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*(?::[\w][\w.-]{0,127})?$/;

let counter = 0;

export class BuildForm extends Widget {
  onValidity: (valid: boolean) => void = () => undefined;
  private _tag: HTMLInputElement;
  private _source: HTMLSelectElement;
  private _path: HTMLInputElement;
  private _text: HTMLTextAreaElement;
  private _squash: HTMLInputElement;
  private _error: HTMLElement;
  private _pathRow: HTMLElement;
  private _textRow: HTMLElement;

  constructor(options: { path?: string; maxBytes?: number }) {
    super();
    this.addClass('jp-PodmanHpc-buildForm');
    const id = `jp-PodmanHpc-build-${++counter}`;
    const path = options.path ?? '';
    this._tag = h('input', {
      id: `${id}-tag`,
      name: 'tag',
      type: 'text',
      class: 'jp-mod-styled',
      value: path ? defaultTag(path) : '',
      placeholder: 'localhost/my-image:latest',
      spellcheck: 'false'
    });
    this._source = h(
      'select',
      { id: `${id}-source`, name: 'source', class: 'jp-mod-styled' },
      h('option', { value: 'path' }, 'A Containerfile in the server’s directory'),
      h('option', { value: 'text' }, 'Containerfile text')
    );
    this._source.value = path ? 'path' : 'text';
    this._path = h('input', {
      id: `${id}-path`,
      name: 'path',
      type: 'text',
      class: 'jp-mod-styled',
      value: path,
      placeholder: 'path/to/Containerfile',
      spellcheck: 'false'
    });
    this._text = h('textarea', {
      id: `${id}-text`,
      name: 'containerfile',
      class: 'jp-mod-styled jp-PodmanHpc-containerfileText',
      rows: 8,
      spellcheck: 'false',
      placeholder: 'FROM 127.0.0.1:5000/...\nRUN ...'
    });
    this._squash = h('input', { id: `${id}-squash`, name: 'squash', type: 'checkbox', checked: true });
    this._error = h('div', { class: 'jp-PodmanHpc-fieldError', role: 'alert', 'aria-live': 'polite' });
    this._pathRow = h(
      'div',
      { class: 'jp-PodmanHpc-field', 'data-field': 'path' },
      h('label', { for: `${id}-path` }, 'Containerfile'),
      h(
        'div',
        { class: 'jp-PodmanHpc-control' },
        this._path,
        h('div', { class: 'jp-PodmanHpc-hint' }, 'Relative to the server’s root; its directory is the build context.')
      )
    );
    this._textRow = h(
      'div',
      { class: 'jp-PodmanHpc-field', 'data-field': 'containerfile' },
      h('label', { for: `${id}-text` }, 'Containerfile'),
      h('div', { class: 'jp-PodmanHpc-control' }, this._text)
    );
    this.node.append(
      h(
        'div',
        { class: 'jp-PodmanHpc-formGrid' },
        h(
          'div',
          { class: 'jp-PodmanHpc-field', 'data-field': 'tag' },
          h('label', { for: `${id}-tag` }, 'Tag'),
          h('div', { class: 'jp-PodmanHpc-control' }, this._tag)
        ),
        h(
          'div',
          { class: 'jp-PodmanHpc-field', 'data-field': 'source' },
          h('label', { for: `${id}-source` }, 'From'),
          h('div', { class: 'jp-PodmanHpc-control' }, this._source)
        ),
        this._pathRow,
        this._textRow,
        h(
          'div',
          { class: 'jp-PodmanHpc-field', 'data-field': 'squash' },
          h('span', {}),
          h(
            'div',
            { class: 'jp-PodmanHpc-control' },
            h(
              'label',
              { class: 'jp-PodmanHpc-checkbox' },
              this._squash,
              ' Squash it afterwards (jobs run squashed images)'
            )
          )
        )
      ),
      this._error
    );
    this.node.addEventListener('input', () => this.check());
    this.node.addEventListener('change', () => this.check());
  }

  /** Whether the values are acceptable; shows what is wrong. */
  check(): boolean {
    const byText = this._source.value === 'text';
    this._pathRow.hidden = byText;
    this._textRow.hidden = !byText;
    let message = '';
    const tag = this._tag.value.trim();
    if (!tag) {
      message = 'Give the image a tag, e.g. localhost/my-image:latest.';
    } else if (!TAG.test(tag)) {
      message = `${tag} is not an image reference (lower-case name, optional :tag).`;
    } else if (byText && !this._text.value.trim()) {
      message = 'Write the Containerfile.';
    } else if (!byText && !this._path.value.trim()) {
      message = 'Give the path of the Containerfile.';
    }
    setText(this._error, message);
    this._tag.classList.toggle('jp-mod-error', !!message && (!tag || !TAG.test(tag)));
    this.onValidity(!message);
    return !message;
  }

  getValue(): IBuildRequest {
    const request: IBuildRequest = {
      tag: this._tag.value.trim(),
      squash: this._squash.checked
    };
    if (this._source.value === 'text') {
      request.containerfile = this._text.value;
    } else {
      request.path = this._path.value.trim();
    }
    return request;
  }
}

/** A dialog that does not accept while its form is invalid. */
class BuildDialog extends Dialog<IBuildRequest> {
  constructor(
    private _form: BuildForm,
    title: string
  ) {
    super({
      title,
      body: _form,
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Build', className: 'jp-PodmanHpc-buildButton' })],
      focusNodeSelector: 'input[name="tag"]'
    });
    this.addClass('jp-PodmanHpc-buildDialog');
    const build = this.node.querySelector('.jp-PodmanHpc-buildButton') as HTMLButtonElement | null;
    _form.onValidity = valid => {
      if (build) {
        build.disabled = !valid;
      }
    };
    _form.check();
  }

  resolve(index?: number): void {
    if ((index === undefined || index === 1) && !this._form.check()) {
      return;
    }
    super.resolve(index);
  }
}

/** Ask for a build; null when cancelled. */
export async function askBuild(path?: string): Promise<IBuildRequest | null> {
  const form = new BuildForm({ path });
  const dialog = new BuildDialog(form, path ? `Build image from ${PathExt.basename(path)}` : 'Build image');
  const result = await dialog.launch();
  return result.button.accept && result.value ? result.value : null;
}
