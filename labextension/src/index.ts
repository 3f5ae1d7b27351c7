/**
 * The JupyterLab front end of jupyter-podman-hpc.
 *
 * A thin front: everything it shows or does goes through the server
 * extension's REST API, which calls the engine. This first plugin only
 * registers itself, reads its settings and offers an "About" command; later
 * plugins add the image browser, the job panel and "Run at scale".
 */

import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { Dialog, ICommandPalette, showDialog } from '@jupyterlab/apputils';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { Widget } from '@lumino/widgets';

/** The plugin's id; its settings schema is schema/plugin.json. */
export const PLUGIN_ID = 'jupyter-podman-hpc:plugin';

/** Command ids, in one place. */
export namespace CommandIDs {
  export const about = 'podman-hpc:about';
}

/** The user's defaults for jobs (mirrors schema/plugin.json). */
export interface ISettings {
  nodes: number;
  tasksPerNode: number;
  time: string;
  partition: string;
  /** Seconds between two refreshes of job status. */
  refreshInterval: number;
}

/** The schema's defaults, used until the settings are loaded. */
export const DEFAULT_SETTINGS: ISettings = {
  nodes: 1,
  tasksPerNode: 1,
  time: '00:10:00',
  partition: '',
  refreshInterval: 5
};

function readSettings(settings: ISettingRegistry.ISettings): ISettings {
  return {
    ...DEFAULT_SETTINGS,
    ...(settings.composite as Partial<ISettings>)
  };
}

function aboutBody(current: ISettings): Widget {
  const body = document.createElement('div');
  body.className = 'jp-PodmanHpc-about';
  const intro = document.createElement('p');
  intro.textContent =
    'jupyter-podman-hpc runs podman-hpc containers and Slurm jobs from JupyterLab.';
  body.appendChild(intro);
  const list = document.createElement('dl');
  const rows: [string, string][] = [
    ['Nodes', String(current.nodes)],
    ['Tasks per node', String(current.tasksPerNode)],
    ['Time limit', current.time],
    ['Partition', current.partition || '(cluster default)'],
    ['Refresh interval', `${current.refreshInterval} s`]
  ];
  for (const [name, value] of rows) {
    const dt = document.createElement('dt');
    dt.textContent = name;
    const dd = document.createElement('dd');
    dd.textContent = value;
    list.append(dt, dd);
  }
  body.appendChild(list);
  return new Widget({ node: body });
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'podman-hpc containers and Slurm jobs from JupyterLab.',
  autoStart: true,
  optional: [ICommandPalette, ISettingRegistry],
  activate: (
    app: JupyterFrontEnd,
    palette: ICommandPalette | null,
    settingRegistry: ISettingRegistry | null
  ) => {
    console.log('jupyter-podman-hpc is activated');
    let current: ISettings = { ...DEFAULT_SETTINGS };

    if (settingRegistry) {
      settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          current = readSettings(settings);
          settings.changed.connect(() => {
            current = readSettings(settings);
          });
        })
        .catch(reason => {
          console.warn('jupyter-podman-hpc: cannot load its settings', reason);
        });
    }

    app.commands.addCommand(CommandIDs.about, {
      label: 'About podman-hpc',
      caption: 'What jupyter-podman-hpc is, and your job defaults',
      execute: () =>
        showDialog({
          title: 'podman-hpc',
          body: aboutBody(current),
          buttons: [Dialog.okButton()]
        })
    });
    if (palette) {
      palette.addItem({ command: CommandIDs.about, category: 'podman-hpc' });
    }
  }
};

export default plugin;
