/**
 * The extension's settings (schema/plugin.json): job defaults and the job
 * refresh interval, with what the user set kept apart from the schema's
 * defaults, so that a value the user chose wins over the server's default and
 * the server's default wins over the schema's.
 */

import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { ISignal, Signal } from '@lumino/signaling';

/** The plugin's id; its settings schema is schema/plugin.json. */
export const PLUGIN_ID = 'jupyter-podman-hpc:plugin';

/** The user's defaults for jobs (mirrors schema/plugin.json). */
export interface ISettings {
  nodes: number;
  tasksPerNode: number;
  time: string;
  partition: string;
  account: string;
  /** Seconds between two refreshes of job status. */
  refreshInterval: number;
}

/** The schema's defaults, used until the settings are loaded. */
export const DEFAULT_SETTINGS: ISettings = {
  nodes: 1,
  tasksPerNode: 1,
  time: '00:10:00',
  partition: '',
  account: '',
  refreshInterval: 5
};

/** The current settings, and which of them the user set. */
export class Settings {
  private _current: ISettings = { ...DEFAULT_SETTINGS };
  private _user: Partial<ISettings> = {};
  private _changed = new Signal<this, void>(this);

  get current(): ISettings {
    return this._current;
  }

  /** Values the user set (not the schema's defaults). */
  get user(): Partial<ISettings> {
    return this._user;
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  load(settings: ISettingRegistry.ISettings): void {
    const read = () => {
      this._current = {
        ...DEFAULT_SETTINGS,
        ...(settings.composite as Partial<ISettings>)
      };
      this._user = { ...(settings.user as Partial<ISettings>) };
      this._changed.emit();
    };
    read();
    settings.changed.connect(read);
  }
}
