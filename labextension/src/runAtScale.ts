/**
 * "Run at scale": a dialog that submits the notebook as a multi-node Slurm
 * job (POST jobs), after an optional preview of the exact batch script
 * (POST jobs?preview=1).
 *
 * The form checks what it can before anything is sent (nodes and tasks per
 * node within the server's limits, a Slurm time limit, a squashed image,
 * modules that go together) and disables Submit while a value is wrong; the
 * server checks again and its 4xx messages are shown in the dialog.
 */

import { Dialog, Notification } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { api, IImage, IJob, IJobSpec, IModule, IUIConfig } from './api';
import { ISettings } from './settings';
import { button, durationSeconds, h, messageOf, sameImage, setText, SLURM_NAME, TIME_HELP, wholeNumber } from './util';

const MODE_HELP: { [mode: string]: string } = {
  'podman-exec': 'one container per node; every rank is exec’d into it (podman-hpc shared-run)',
  'per-process': 'one container per rank (podman-hpc run)'
};

const MAX_GPUS = 64;

let counter = 0;

/** What the form needs to know. */
export interface IRunAtScaleOptions {
  /** The notebook's path relative to the server root (as the contents API gives it). */
  notebookPath: string;
  /** The image of the notebook's kernel, when it is a podman-hpc kernel. */
  kernelImage: string | null;
  config: IUIConfig;
  images: IImage[];
  /** The extension's settings, and which of them the user set. */
  settings: ISettings;
  userSettings: Partial<ISettings>;
  /** Save the notebook (before it is submitted). */
  save: () => Promise<void>;
  /** Run code in the notebook's kernel, in a new cell (the "Interactive cluster" choice). */
  startCluster?: (code: string) => Promise<void>;
}

interface IField {
  row: HTMLElement;
  control: HTMLInputElement | HTMLSelectElement;
  error: HTMLElement;
}

/** The body of the "Run at scale" dialog. */
export class RunAtScaleForm extends Widget {
  /** Called whenever the form's validity may have changed. */
  onValidity: (valid: boolean) => void = () => undefined;

  private _options: IRunAtScaleOptions;
  private _fields: { [name: string]: IField } = {};
  private _modules: Map<string, { module: IModule; input: HTMLInputElement; note: HTMLElement }> = new Map();
  private _summary: HTMLElement;
  private _serverError: HTMLElement;
  private _preview: HTMLElement;
  private _script: HTMLElement;
  private _previewNote: HTMLElement;
  private _modeHint: HTMLElement;
  private _valid = false;
  private _busy = false;
  private _job: IJob | null = null;
  private _previewed: string | null = null;

  constructor(options: IRunAtScaleOptions) {
    super();
    this._options = options;
    this.addClass('jp-PodmanHpc-runForm');
    const { config, settings, userSettings } = options;
    const defaults = config.defaults;
    const pick = <K extends keyof ISettings>(key: K, server: ISettings[K] | undefined) =>
      (userSettings[key] !== undefined ? userSettings[key] : (server ?? settings[key])) as ISettings[K];

    const node = this.node;
    node.append(
      h(
        'p',
        { class: 'jp-PodmanHpc-runTarget' },
        'Notebook ',
        h('code', {}, options.notebookPath),
        ' as a Slurm batch job'
      )
    );
    // three rows: the image; the allocation; where it is charged and how it runs
    const imageRow = h('div', { class: 'jp-PodmanHpc-formRow jp-mod-wide' });
    const sizeRow = h('div', { class: 'jp-PodmanHpc-formRow' });
    const slurmRow = h('div', { class: 'jp-PodmanHpc-formRow' });
    this._modeHint = h('div', { class: 'jp-PodmanHpc-hint jp-PodmanHpc-modeHint' });
    node.append(imageRow, sizeRow, slurmRow, this._modeHint);

    // image: the squashed ones (a job's nodes run images from the squashed store)
    const image = h('select', { name: 'image', class: 'jp-mod-styled' });
    const squashed = squashedNames(options.images);
    if (!squashed.length) {
      image.append(h('option', { value: '' }, '(no squashed image)'));
    }
    for (const name of squashed) {
      image.append(h('option', { value: name }, name));
    }
    const kernelImage = options.kernelImage;
    const kernelMatch = kernelImage ? squashed.find(name => sameImage(name, kernelImage)) : undefined;
    if (kernelMatch) {
      image.value = kernelMatch;
    }
    let imageHint: HTMLElement | null = null;
    if (kernelImage && !kernelMatch) {
      imageHint = h(
        'div',
        { class: 'jp-PodmanHpc-hint', role: 'note' },
        'This notebook’s kernel runs ',
        h('code', {}, kernelImage),
        ', which is not squashed: squash it in the Containers panel to run the job in it, or choose a squashed image.'
      );
    } else if (!squashed.length) {
      imageHint = h(
        'div',
        { class: 'jp-PodmanHpc-hint', role: 'note' },
        'Jobs run squashed images: pull or squash one in the Containers panel.'
      );
    }
    this._addField(imageRow, 'image', 'Image', image, imageHint);

    const limits = config.limits;
    const number = (name: string, value: number, min: number, max: number) =>
      h('input', {
        name,
        type: 'number',
        class: 'jp-mod-styled',
        min,
        max,
        step: 1,
        value,
        inputmode: 'numeric'
      });
    this._addField(
      sizeRow,
      'nodes',
      'Nodes',
      number('nodes', pick('nodes', defaults.nodes), 1, limits.max_nodes),
      null,
      `1 to ${limits.max_nodes}`
    );
    this._addField(
      sizeRow,
      'tasks_per_node',
      'Tasks per node',
      number('tasks_per_node', pick('tasksPerNode', defaults.tasks_per_node), 1, limits.max_tasks_per_node),
      null,
      `MPI ranks on each node, 1 to ${limits.max_tasks_per_node}`
    );
    this._addField(
      sizeRow,
      'gpus_per_node',
      'GPUs per node',
      number('gpus_per_node', 0, 0, MAX_GPUS),
      null,
      `0 to ${MAX_GPUS}`
    );
    this._addField(
      sizeRow,
      'time',
      'Time limit',
      h('input', {
        name: 'time',
        type: 'text',
        class: 'jp-mod-styled',
        value: pick('time', defaults.time || undefined),
        placeholder: 'HH:MM:SS',
        spellcheck: 'false'
      }),
      null,
      'Wall-clock limit: HH:MM:SS, D-HH:MM:SS or minutes'
    );

    // partition: from sinfo; free text when Slurm could not be asked
    const partitionValue = pick('partition', defaults.partition || undefined) || '';
    let partition: HTMLSelectElement | HTMLInputElement;
    let partitionHint: HTMLElement | null = null;
    if (config.partitions.length) {
      partition = h('select', { name: 'partition', class: 'jp-mod-styled' });
      partition.append(h('option', { value: '' }, '(cluster default)'));
      for (const p of config.partitions) {
        const detail = `${p.nodes} nodes, ${p.available}${p.default ? ', default' : ''}`;
        partition.append(h('option', { value: p.name }, `${p.name} (${detail})`));
      }
      if (partitionValue && !config.partitions.some(p => p.name === partitionValue)) {
        partition.append(h('option', { value: partitionValue }, `${partitionValue} (not listed by sinfo)`));
      }
      partition.value = partitionValue;
    } else {
      partition = h('input', {
        name: 'partition',
        type: 'text',
        class: 'jp-mod-styled',
        value: partitionValue,
        placeholder: '(cluster default)'
      });
    }
    if (config.slurm_error) {
      partitionHint = h(
        'div',
        { class: 'jp-PodmanHpc-hint jp-mod-warning', role: 'note' },
        `Partitions unavailable: ${config.slurm_error}`
      );
    }
    this._addField(slurmRow, 'partition', 'Partition', partition, partitionHint);
    this._addField(
      slurmRow,
      'account',
      'Account',
      h('input', {
        name: 'account',
        type: 'text',
        class: 'jp-mod-styled',
        value: pick('account', defaults.account || undefined) || '',
        placeholder: '(your default account)',
        spellcheck: 'false'
      })
    );

    const mode = h('select', { name: 'mode', class: 'jp-mod-styled' });
    for (const name of config.modes.length ? config.modes : ['podman-exec', 'per-process']) {
      mode.append(h('option', { value: name, title: MODE_HELP[name] ?? '' }, name));
    }
    mode.value = defaults.mode || 'podman-exec';
    this._addField(slurmRow, 'mode', 'Mode', mode);

    // papermill's convention: injected after the notebook's cell tagged "parameters"
    const parameters = h('textarea', {
      name: 'parameters',
      class: 'jp-mod-styled jp-PodmanHpc-parameters',
      rows: '2',
      placeholder: "alpha=0.5\nname='run 2'",
      spellcheck: 'false'
    }) as unknown as HTMLInputElement;
    this._addField(
      slurmRow,
      'parameters',
      'Parameters',
      parameters,
      h(
        'div',
        { class: 'jp-PodmanHpc-hint' },
        'One NAME=VALUE per line, VALUE a Python literal; set after the cell tagged “parameters”.'
      )
    );

    // run as a batch job, or as an interactive cluster of engines for this notebook's kernel
    const runAs = h('select', { name: 'run_as', class: 'jp-mod-styled' });
    runAs.append(h('option', { value: 'batch' }, 'Batch job'));
    if (options.startCluster) {
      runAs.append(
        h(
          'option',
          { value: 'cluster', title: 'IPython Parallel engines on the nodes, for %%px in this notebook' },
          'Interactive cluster'
        )
      );
    }
    this._addField(slurmRow, 'run_as', 'Run as', runAs);

    // modules: checkboxes; one that conflicts with a checked one is disabled
    const modules = h('fieldset', { class: 'jp-PodmanHpc-modules' }, h('legend', {}, 'Modules'));
    if (config.module_error) {
      modules.append(h('div', { class: 'jp-PodmanHpc-hint jp-mod-warning' }, config.module_error));
    }
    if (!config.modules.length && !config.module_error) {
      modules.append(h('div', { class: 'jp-PodmanHpc-hint' }, 'The site defines no modules.'));
    }
    const moduleList = h('div', { class: 'jp-PodmanHpc-moduleList' });
    modules.append(moduleList);
    for (const module of config.modules) {
      const id = `jp-PodmanHpc-module-${++counter}`;
      const input = h('input', { type: 'checkbox', id, name: 'module', value: module.name });
      const note = h('span', { class: 'jp-PodmanHpc-moduleNote' });
      const label = h(
        'label',
        { for: id, title: module.help },
        h('span', { class: 'jp-PodmanHpc-moduleName' }, module.name),
        ' ',
        h('span', { class: 'jp-PodmanHpc-moduleHelp' }, module.help)
      );
      moduleList.append(h('div', { class: 'jp-PodmanHpc-module', 'data-module': module.name }, input, label, note));
      input.addEventListener('change', () => {
        if (input.checked) {
          for (const dependency of module.depends_on) {
            const other = this._modules.get(dependency);
            if (other && !other.input.disabled) {
              other.input.checked = true;
            }
          }
        }
        this._update();
      });
      this._modules.set(module.name, { module, input, note });
    }
    node.append(modules);

    this._summary = h('div', { class: 'jp-PodmanHpc-summary', 'aria-live': 'polite' });
    this._serverError = h('div', { class: 'jp-PodmanHpc-serverError', role: 'alert' });
    node.append(this._summary, this._serverError);

    this._script = h('pre', {
      class: 'jp-PodmanHpc-script',
      tabindex: 0,
      'aria-label': 'Batch script (read-only)',
      'aria-readonly': 'true'
    });
    this._previewNote = h('span', { class: 'jp-PodmanHpc-previewNote' });
    const copy = button(
      'Copy',
      () => {
        void navigator.clipboard?.writeText(this._script.textContent ?? '');
      },
      { title: 'Copy the batch script' }
    );
    this._preview = h(
      'div',
      { class: 'jp-PodmanHpc-preview', hidden: true },
      h('div', { class: 'jp-PodmanHpc-previewHeader' }, h('span', {}, 'Batch script'), this._previewNote, copy),
      this._script
    );
    node.append(this._preview);

    node.addEventListener('input', () => this._update());
    node.addEventListener('change', () => this._update());
    this._update();
  }

  /** Whether every value is acceptable. */
  get valid(): boolean {
    return this._valid;
  }

  /** The job the dialog submitted (its value). */
  getValue(): IJob | null {
    return this._job;
  }

  /** The JobSpec the form describes (valid or not). */
  spec(): IJobSpec {
    const value = (name: string) => this._fields[name].control.value.trim();
    const gpus = wholeNumber(value('gpus_per_node')) ?? 0;
    const { params } = this._parameters();
    return {
      image: value('image'),
      notebook: this._options.notebookPath,
      nodes: wholeNumber(value('nodes')) ?? 0,
      tasks_per_node: wholeNumber(value('tasks_per_node')) ?? 0,
      gpus_per_node: gpus || null,
      time: value('time'),
      partition: value('partition') || null,
      account: value('account') || null,
      modules: [...this._modules.values()].filter(m => m.input.checked).map(m => m.module.name),
      mode: value('mode'),
      ...(Object.keys(params).length ? { parameters: params } : {})
    };
  }

  /** The Parameters field as NAME=VALUE lines (the server checks the values are Python literals). */
  private _parameters(): { params: { [name: string]: string }; error: string } {
    const params: { [name: string]: string } = {};
    let error = '';
    for (const line of this._fields['parameters'].control.value.split('\n')) {
      if (!line.trim()) {
        continue;
      }
      const at = line.indexOf('=');
      const name = at > 0 ? line.slice(0, at).trim() : '';
      if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) {
        error ||= `Not NAME=VALUE: ${line.trim()}`;
        continue;
      }
      params[name] = line.slice(at + 1).trim();
    }
    return { params, error };
  }

  /** Show the batch script the server would submit. */
  async preview(): Promise<void> {
    if (this._busy || !this._check(true)) {
      return;
    }
    this._setBusy(true, 'Rendering the batch script…');
    const spec = this.spec();
    try {
      const script = await api.preview(spec);
      this._previewed = JSON.stringify(spec);
      this._script.textContent = script;
      this._preview.hidden = false;
      this._preview.scrollIntoView({ block: 'nearest' });
      setText(this._previewNote, '');
      this._setServerError('');
    } catch (error) {
      this._setServerError(messageOf(error));
    } finally {
      this._setBusy(false);
    }
  }

  /** Whether the choice is an interactive cluster (started in the kernel) rather than a batch job. */
  get interactive(): boolean {
    return this._fields['run_as'].control.value === 'cluster';
  }

  /** Save the notebook and submit it; true when the job was submitted (or the cluster asked for). */
  async submit(): Promise<boolean> {
    if (this._busy || !this._check(true)) {
      return false;
    }
    if (this.interactive && this._options.startCluster) {
      await this._options.startCluster(clusterCode(this.spec()));
      return true;
    }
    this._setBusy(true, 'Saving the notebook…');
    try {
      try {
        await this._options.save();
      } catch (error) {
        this._setServerError(`Cannot save the notebook: ${messageOf(error)}`);
        return false;
      }
      setText(this._summary, 'Submitting…');
      try {
        this._job = await api.submit(this.spec());
      } catch (error) {
        this._setServerError(messageOf(error));
        return false;
      }
      return true;
    } finally {
      this._setBusy(false);
    }
  }

  private _addField(
    container: HTMLElement,
    name: string,
    label: string,
    control: HTMLInputElement | HTMLSelectElement,
    hint: HTMLElement | null = null,
    title = ''
  ): void {
    const id = `jp-PodmanHpc-field-${name}-${++counter}`;
    control.id = id;
    if (title) {
      control.title = title;
    }
    const error = h('div', { class: 'jp-PodmanHpc-fieldError', id: `${id}-error`, 'aria-live': 'polite' });
    control.setAttribute('aria-describedby', `${id}-error`);
    const row = h(
      'div',
      { class: 'jp-PodmanHpc-field', 'data-field': name },
      h('label', { for: id }, label),
      h('div', { class: 'jp-PodmanHpc-control' }, control, hint, error)
    );
    container.append(row);
    this._fields[name] = { row, control, error };
  }

  private _update(): void {
    this._check(false);
    if (this._previewed !== null) {
      const stale = this._previewed !== JSON.stringify(this.spec());
      this._preview.classList.toggle('jp-mod-stale', stale);
      setText(this._previewNote, stale ? 'the form changed: Preview again' : '');
    }
  }

  /**
   * Check every value; mark the wrong ones (and, with `focus`, move to the
   * first). Returns whether the form is valid.
   */
  private _check(focus: boolean): boolean {
    const { limits } = this._options.config;
    const errors: { [name: string]: string } = {};
    const value = (name: string) => this._fields[name].control.value.trim();

    if (!value('image')) {
      errors.image = 'Choose a squashed image.';
    }
    const range = (name: string, label: string, low: number, high: number) => {
      const n = wholeNumber(value(name));
      if (n === null) {
        errors[name] = `${label} must be a whole number.`;
      } else if (n < low || n > high) {
        errors[name] = `${label} must be between ${low} and ${high}.`;
      }
    };
    range('nodes', 'Nodes', 1, limits.max_nodes);
    range('tasks_per_node', 'Tasks per node', 1, limits.max_tasks_per_node);
    range('gpus_per_node', 'GPUs per node', 0, MAX_GPUS);
    const time = value('time');
    if (!time) {
      errors.time = 'Give a time limit.';
    } else {
      const seconds = durationSeconds(time);
      if (seconds === undefined) {
        errors.time = `Not a Slurm time limit: ${TIME_HELP}.`;
      } else if (seconds === 0) {
        errors.time = 'The time limit must be longer than zero.';
      }
    }
    const partition = value('partition');
    if (partition && !/^[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*$/.test(partition)) {
      errors.partition = 'Not a partition name.';
    }
    const account = value('account');
    if (account && !SLURM_NAME.test(account)) {
      errors.account = 'Letters, digits and _ . + @ : - only.';
    }
    const parameterError = this._parameters().error;
    if (parameterError) {
      errors.parameters = parameterError;
    }

    // modules: conflicts disable, per-process excludes modules that need one container per node
    const mode = value('mode');
    const checked = [...this._modules.values()].filter(m => m.input.checked).map(m => m.module);
    const moduleErrors: string[] = [];
    for (const { module, input, note } of this._modules.values()) {
      const conflict = checked.find(
        other =>
          other.name !== module.name && (other.conflicts.includes(module.name) || module.conflicts.includes(other.name))
      );
      const sharedOnly = mode === 'per-process' && module.shared_run;
      let reason = '';
      if (conflict) {
        reason = `conflicts with ${conflict.name}`;
      } else if (sharedOnly) {
        reason = 'needs mode podman-exec';
      }
      input.disabled = !!reason && !input.checked;
      setText(note, reason ? `(${reason})` : '');
      if (input.checked && reason) {
        moduleErrors.push(`${module.name} ${reason}.`);
      }
      if (input.checked) {
        const missing = module.depends_on.filter(d => !checked.some(c => c.name === d));
        if (missing.length) {
          moduleErrors.push(`${module.name} needs ${missing.join(', ')}.`);
        }
      }
    }
    setText(this._modeHint, MODE_HELP[mode] ?? '');

    let first: HTMLElement | null = null;
    for (const [name, field] of Object.entries(this._fields)) {
      const message = errors[name] ?? '';
      setText(field.error, message);
      field.row.classList.toggle('jp-mod-error', !!message);
      field.control.classList.toggle('jp-mod-error', !!message);
      field.control.setAttribute('aria-invalid', message ? 'true' : 'false');
      if ('setCustomValidity' in field.control) {
        field.control.setCustomValidity(message);
      }
      if (message && !first) {
        first = field.control;
      }
    }
    const moduleBox = this.node.querySelector('.jp-PodmanHpc-modules') as HTMLElement;
    moduleBox.classList.toggle('jp-mod-error', moduleErrors.length > 0);

    const messages = [...Object.values(errors), ...moduleErrors];
    const valid = messages.length === 0;
    if (valid) {
      const n = wholeNumber(value('nodes'))!;
      const t = wholeNumber(value('tasks_per_node'))!;
      setText(
        this._summary,
        `${n} node${n === 1 ? '' : 's'} × ${t} task${t === 1 ? '' : 's'} = ${n * t} rank${n * t === 1 ? '' : 's'}, ${mode}`
      );
    } else {
      setText(this._summary, moduleErrors.length ? moduleErrors.join(' ') : 'Correct the values marked above.');
    }
    this._summary.classList.toggle('jp-mod-error', !valid);
    if (focus && first) {
      first.focus();
    }
    this._valid = valid;
    this.onValidity(valid && !this._busy);
    return valid;
  }

  private _setBusy(busy: boolean, message = ''): void {
    this._busy = busy;
    this.node.classList.toggle('jp-mod-busy', busy);
    this.node.setAttribute('aria-busy', busy ? 'true' : 'false');
    if (busy) {
      setText(this._summary, message);
      this.onValidity(false);
    } else {
      this._check(false);
    }
  }

  private _setServerError(message: string): void {
    setText(this._serverError, message);
    this._serverError.hidden = !message;
  }
}

/** The cell that starts an interactive cluster of the form's shape in the notebook's kernel. */
export function clusterCode(spec: IJobSpec): string {
  const words = ['--nodes', String(spec.nodes), '--tasks-per-node', String(spec.tasks_per_node)];
  const options: [string, string | number | null][] = [
    ['--time', spec.time || null],
    ['--partition', spec.partition],
    ['--account', spec.account],
    ['--gpus-per-node', spec.gpus_per_node]
  ];
  for (const [flag, value] of options) {
    if (value) {
      words.push(flag, String(value));
    }
  }
  for (const module of spec.modules) {
    words.push('--module', module);
  }
  words.push(spec.image);
  const quoted = words.map(w => (/^[A-Za-z0-9_.,:/=@%+-]+$/.test(w) ? w : `'${w.replace(/'/g, "'\"'\"'")}'`));
  return `%load_ext jupyter_podman_hpc\ncluster = %podman_hpc cluster start ${quoted.join(' ')}`;
}

/** Every name of every squashed image, sorted. */
export function squashedNames(images: IImage[]): string[] {
  const names = new Set<string>();
  for (const image of images) {
    if (image.squashed) {
      for (const name of image.names) {
        if (name && !name.endsWith('<none>')) {
          names.add(name);
        }
      }
    }
  }
  return [...names].sort();
}

/** The dialog: Cancel, Preview (stays open) and Submit (closes once the job is submitted). */
class RunAtScaleDialog extends Dialog<IJob | null> {
  private static PREVIEW = 1;
  private static SUBMIT = 2;
  private _form: RunAtScaleForm;

  constructor(form: RunAtScaleForm) {
    super({
      title: 'Run at scale',
      body: form,
      buttons: [
        Dialog.cancelButton(),
        Dialog.createButton({
          label: 'Preview',
          caption: 'Show the batch script without submitting it',
          className: 'jp-PodmanHpc-previewButton'
        }),
        Dialog.okButton({
          label: 'Submit',
          caption: 'Save the notebook and submit it to Slurm',
          className: 'jp-PodmanHpc-submitButton'
        })
      ],
      defaultButton: RunAtScaleDialog.SUBMIT,
      focusNodeSelector: 'select[name="image"]'
    });
    this._form = form;
    this.addClass('jp-PodmanHpc-runDialog');
    const submit = this.node.querySelector('.jp-PodmanHpc-submitButton') as HTMLButtonElement | null;
    const preview = this.node.querySelector('.jp-PodmanHpc-previewButton') as HTMLButtonElement | null;
    form.onValidity = valid => {
      if (submit) {
        submit.disabled = !valid;
        submit.setAttribute('aria-disabled', valid ? 'false' : 'true');
      }
      if (preview) {
        preview.disabled = form.node.classList.contains('jp-mod-busy');
      }
    };
    form.onValidity(form.valid);
  }

  resolve(index?: number): void {
    const chosen = index ?? RunAtScaleDialog.SUBMIT;
    if (chosen === RunAtScaleDialog.PREVIEW) {
      void this._form.preview();
      return;
    }
    if (chosen === RunAtScaleDialog.SUBMIT) {
      void this._form.submit().then(submitted => {
        if (submitted) {
          super.resolve(chosen);
        }
      });
      return;
    }
    super.resolve(index);
  }
}

/**
 * Open the dialog for a notebook; resolves with the submitted job, or null
 * when the user cancelled. Errors loading what the form needs are thrown.
 */
export async function runAtScale(options: Omit<IRunAtScaleOptions, 'config' | 'images'>): Promise<IJob | null> {
  const [config, images] = await Promise.all([api.config(), api.images()]);
  const form = new RunAtScaleForm({ ...options, config, images });
  const dialog = new RunAtScaleDialog(form);
  const result = await dialog.launch();
  const job = result.button.accept ? (result.value ?? null) : null;
  if (result.button.accept && form.interactive) {
    Notification.info('Starting an interactive cluster in the notebook’s kernel (see the new cell)', {
      autoClose: 5000
    });
  }
  if (job) {
    Notification.success(`Submitted ${options.notebookPath} as job ${job.id}`, { autoClose: 5000 });
  }
  return job;
}
