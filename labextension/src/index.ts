/**
 * The JupyterLab front end of jupyter-podman-hpc.
 *
 * A thin front: everything it shows or does goes through the server
 * extension's REST API (src/api.ts), which calls the engine.
 *
 * - "Run at scale" (src/runAtScale.ts): a button in every notebook's
 *   toolbar, a command in the palette and the notebook's context menu.
 * - The "Containers" side panel (src/panel.ts): images (pull, squash,
 *   remove squashed, make kernel), builds, Slurm jobs (logs in src/logs.ts).
 * - "Build Image…" on Containerfiles in the file browser (src/build.ts).
 * - Settings (schema/plugin.json): job defaults and the refresh interval.
 */

import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import {
  Clipboard,
  Dialog,
  ICommandPalette,
  IToolbarWidgetRegistry,
  showDialog,
  showErrorMessage
} from '@jupyterlab/apputils';
import { IEditorServices } from '@jupyterlab/codeeditor';
import { PageConfig } from '@jupyterlab/coreutils';
import { DocumentRegistry } from '@jupyterlab/docregistry';
import { IFileBrowserFactory } from '@jupyterlab/filebrowser';
import { INotebookModel, INotebookTracker, NotebookActions, NotebookPanel } from '@jupyterlab/notebook';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { buildIcon, ToolbarButton } from '@jupyterlab/ui-components';
import { DisposableDelegate, IDisposable } from '@lumino/disposable';
import { Widget } from '@lumino/widgets';

import { IJob } from './api';
import { askBuild, CONTAINERFILE_PATTERN, isContainerfile } from './build';
import { containersIcon, scaleIcon } from './icons';
import { openJobLogs } from './logs';
import { openJobOutput } from './output';
import { ContainersPanel, PANEL_ID } from './panel';
import { runAtScale } from './runAtScale';
import { DEFAULT_SETTINGS, ISettings, PLUGIN_ID, Settings } from './settings';
import { h, messageOf } from './util';

export { PLUGIN_ID, DEFAULT_SETTINGS };
export type { ISettings };

/** Command ids, in one place. */
export namespace CommandIDs {
  export const about = 'podman-hpc:about';
  export const runAtScale = 'podman-hpc:run-at-scale';
  export const openPanel = 'podman-hpc:open-panel';
  export const build = 'podman-hpc:build';
  export const buildFile = 'podman-hpc:build-file';
}

/** The name of the notebook toolbar item (schema/plugin.json, jupyter.lab.toolbars). */
const TOOLBAR_ITEM = 'run-at-scale';
/** The document registry's file type of Containerfiles. */
const CONTAINERFILE_TYPE = 'podman-hpc-containerfile';

function aboutBody(current: ISettings): Widget {
  const body = h('div', { class: 'jp-PodmanHpc-about' });
  body.append(h('p', {}, 'jupyter-podman-hpc runs podman-hpc containers and Slurm jobs from JupyterLab.'));
  const list = h('dl');
  const rows: [string, string][] = [
    ['Nodes', String(current.nodes)],
    ['Tasks per node', String(current.tasksPerNode)],
    ['Time limit', current.time],
    ['Partition', current.partition || '(cluster default)'],
    ['Account', current.account || '(your default)'],
    ['Refresh interval', `${current.refreshInterval} s`]
  ];
  for (const [name, value] of rows) {
    list.append(h('dt', {}, name), h('dd', {}, value));
  }
  body.append(list);
  return new Widget({ node: body });
}

/** The image of a notebook's kernel, when its kernelspec is a podman-hpc one. */
function kernelImage(app: JupyterFrontEnd, panel: NotebookPanel): string | null {
  const session = panel.sessionContext;
  const name = session.session?.kernel?.name ?? session.kernelPreference.name;
  if (!name) {
    return null;
  }
  const spec = app.serviceManager.kernelspecs.specs?.kernelspecs[name];
  const metadata = (spec?.metadata ?? {}) as any;
  const image =
    metadata?.podman_hpc?.image ??
    (metadata?.kernel_provisioner?.provisioner_name === 'podman-hpc-provisioner'
      ? metadata?.kernel_provisioner?.config?.image
      : undefined);
  return typeof image === 'string' && image ? image : null;
}

/** A path as the server root sees it (no drive prefix). */
function localPath(app: JupyterFrontEnd, path: string): string {
  return app.serviceManager.contents.localPath(path);
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'podman-hpc containers and Slurm jobs from JupyterLab: Run at scale, the Containers panel, builds.',
  autoStart: true,
  optional: [
    ICommandPalette,
    ISettingRegistry,
    INotebookTracker,
    IFileBrowserFactory,
    IToolbarWidgetRegistry,
    ILayoutRestorer,
    IRenderMimeRegistry,
    IEditorServices
  ],
  activate: (
    app: JupyterFrontEnd,
    palette: ICommandPalette | null,
    settingRegistry: ISettingRegistry | null,
    notebooks: INotebookTracker | null,
    browsers: IFileBrowserFactory | null,
    toolbarRegistry: IToolbarWidgetRegistry | null,
    restorer: ILayoutRestorer | null,
    rendermime: IRenderMimeRegistry | null,
    editorServices: IEditorServices | null
  ) => {
    const settings = new Settings();
    if (settingRegistry) {
      settingRegistry
        .load(PLUGIN_ID)
        .then(loaded => settings.load(loaded))
        .catch(reason => {
          console.warn('jupyter-podman-hpc: cannot load its settings', reason);
        });
    }

    // --- the Containers panel --------------------------------------------------
    const selectedFile = (): string | null => {
      const browser = browsers?.tracker.currentWidget;
      const item = browser?.selectedItems().next();
      if (item && !item.done && item.value.type !== 'directory') {
        return localPath(app, item.value.path);
      }
      return null;
    };
    const proposedContainerfile = (): string | undefined => {
      const selected = selectedFile();
      if (selected && isContainerfile(selected)) {
        return selected;
      }
      const current = app.shell.currentWidget as any;
      const path: unknown = current?.context?.path;
      if (typeof path === 'string' && isContainerfile(path)) {
        return localPath(app, path);
      }
      return undefined;
    };

    const openDirectory = async (job: IJob) => {
      const root = (PageConfig.getOption('serverRoot') || '').replace(/\/+$/, '');
      const directory = job.directory;
      if (root.startsWith('/') && (directory === root || directory.startsWith(root + '/'))) {
        const relative = directory.slice(root.length).replace(/^\/+/, '');
        try {
          await app.commands.execute('filebrowser:go-to-path', { path: relative || '/' });
          return;
        } catch (error) {
          console.warn('jupyter-podman-hpc: cannot open the job directory', error);
        }
      }
      const result = await showDialog({
        title: `Directory of job ${job.id}`,
        body: new Widget({
          node: h(
            'div',
            { class: 'jp-PodmanHpc-directory' },
            h('p', {}, 'The job directory is outside the server’s root, so the file browser cannot show it:'),
            h('code', { class: 'jp-PodmanHpc-directoryPath', tabindex: 0 }, directory)
          )
        }),
        buttons: [
          Dialog.createButton({ label: 'Copy path', className: 'jp-PodmanHpc-copyPath', accept: false }),
          Dialog.okButton({ label: 'Close' })
        ],
        defaultButton: 1
      });
      if (result.button.label === 'Copy path') {
        Clipboard.copyToSystem(directory);
      }
    };

    const panel = new ContainersPanel({
      settings,
      openLogs: job => {
        openJobLogs(app.shell, job, settings.current.refreshInterval);
      },
      openDirectory: job => void openDirectory(job),
      openOutput: job => {
        if (!rendermime || !editorServices) {
          void showErrorMessage('Cannot open the output notebook', 'This JupyterLab has no notebook renderers.');
          return;
        }
        openJobOutput(app.shell, job, { rendermime, editorServices }, settings.current.refreshInterval);
      },
      kernelInstalled: async () => {
        await app.serviceManager.kernelspecs.refreshSpecs();
      },
      askBuild: () => askBuild(proposedContainerfile())
    });
    app.shell.add(panel, 'left', { rank: 650 });
    if (restorer) {
      restorer.add(panel, PANEL_ID);
    }

    const showPanel = (section?: Widget) => {
      app.shell.activateById(PANEL_ID);
      if (section) {
        panel.expand(section);
      }
    };

    // --- Run at scale ------------------------------------------------------------
    const runFor = async (notebook: NotebookPanel) => {
      try {
        await notebook.context.ready;
        const job = await runAtScale({
          notebookPath: localPath(app, notebook.context.path),
          kernelImage: kernelImage(app, notebook),
          settings: settings.current,
          userSettings: settings.user,
          save: () => notebook.context.save(),
          startCluster: async code => {
            NotebookActions.insertBelow(notebook.content);
            notebook.content.activeCell?.model.sharedModel.setSource(code);
            await NotebookActions.run(notebook.content, notebook.sessionContext);
          }
        });
        if (job) {
          showPanel(panel.jobs);
          panel.jobs.reveal(job);
        }
      } catch (error) {
        void showErrorMessage('Cannot run the notebook at scale', messageOf(error));
      }
    };

    app.commands.addCommand(CommandIDs.runAtScale, {
      label: args => (args.isPalette ? 'Run Notebook at Scale…' : 'Run at Scale…'),
      caption: 'Submit this notebook as a multi-node Slurm job running in a container (podman-hpc)',
      icon: args => (args.isPalette ? undefined : scaleIcon),
      isEnabled: () => !!notebooks?.currentWidget,
      execute: async () => {
        const current = notebooks?.currentWidget;
        if (current) {
          await runFor(current);
        }
      }
    });
    if (notebooks) {
      notebooks.currentChanged.connect(() => app.commands.notifyCommandChanged(CommandIDs.runAtScale));
    }
    app.contextMenu.addItem({ command: CommandIDs.runAtScale, selector: '.jp-Notebook', rank: 90 });

    const makeButton = (notebook: NotebookPanel) =>
      new ToolbarButton({
        className: 'jp-PodmanHpc-runAtScaleButton',
        icon: scaleIcon,
        label: 'Run at scale',
        tooltip: 'Run this notebook at scale: a Slurm job over several nodes, in a container (podman-hpc)',
        onClick: () => void runFor(notebook)
      });
    if (toolbarRegistry) {
      // placed by schema/plugin.json (jupyter.lab.toolbars.Notebook), which users can change
      toolbarRegistry.addFactory<NotebookPanel>('Notebook', TOOLBAR_ITEM, makeButton);
    } else {
      class RunAtScaleExtension implements DocumentRegistry.IWidgetExtension<NotebookPanel, INotebookModel> {
        createNew(notebook: NotebookPanel): IDisposable {
          const button = makeButton(notebook);
          if (!notebook.toolbar.insertAfter('cellType', TOOLBAR_ITEM, button)) {
            notebook.toolbar.addItem(TOOLBAR_ITEM, button);
          }
          return new DisposableDelegate(() => button.dispose());
        }
      }
      app.docRegistry.addWidgetExtension('Notebook', new RunAtScaleExtension());
    }

    // --- builds ------------------------------------------------------------------
    app.docRegistry.addFileType({
      name: CONTAINERFILE_TYPE,
      displayName: 'Containerfile',
      pattern: CONTAINERFILE_PATTERN,
      extensions: [],
      mimeTypes: ['text/x-dockerfile'],
      contentType: 'file',
      fileFormat: 'text',
      icon: containersIcon
    });

    const build = async (path?: string) => {
      const request = await askBuild(path);
      if (!request) {
        return;
      }
      showPanel(panel.builds);
      await panel.builds.build(request);
    };
    app.commands.addCommand(CommandIDs.buildFile, {
      label: 'Build Image…',
      caption: 'Build an image from this Containerfile (podman-hpc build)',
      icon: buildIcon,
      isVisible: () => {
        const selected = selectedFile();
        return !!selected && isContainerfile(selected);
      },
      execute: async () => {
        const selected = selectedFile();
        if (selected) {
          await build(selected);
        }
      }
    });
    app.contextMenu.addItem({
      command: CommandIDs.buildFile,
      selector: `.jp-DirListing-item[data-file-type="${CONTAINERFILE_TYPE}"]`,
      rank: 3
    });
    app.commands.addCommand(CommandIDs.build, {
      label: 'Build Image from a Containerfile…',
      caption: 'Build an image (podman-hpc build)',
      execute: () => build(proposedContainerfile())
    });

    app.commands.addCommand(CommandIDs.openPanel, {
      label: 'Show the Containers Panel',
      caption: 'Images, builds and Slurm jobs (podman-hpc)',
      execute: () => showPanel()
    });

    app.commands.addCommand(CommandIDs.about, {
      label: 'About podman-hpc',
      caption: 'What jupyter-podman-hpc is, and your job defaults',
      execute: () =>
        showDialog({
          title: 'podman-hpc',
          body: aboutBody(settings.current),
          buttons: [Dialog.okButton()]
        })
    });

    if (palette) {
      const category = 'podman-hpc';
      palette.addItem({ command: CommandIDs.runAtScale, category, args: { isPalette: true } });
      palette.addItem({ command: CommandIDs.openPanel, category });
      palette.addItem({ command: CommandIDs.build, category });
      palette.addItem({ command: CommandIDs.about, category });
    }

    console.log('jupyter-podman-hpc is activated');
  }
};

export default plugin;
