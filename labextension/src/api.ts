/**
 * The one client of the server extension's REST API (`<base_url>/podman-hpc/api/`).
 *
 * Every call of the front end goes through `requestAPI` (ServerConnection,
 * so the token, the XSRF cookie and the base URL are handled as for every
 * Jupyter API) or, for task event streams, `watchTask` (an EventSource with
 * a polling fallback). The types mirror what the server's handlers return
 * (jupyter_podman_hpc/server/backend.py); errors become `APIError` carrying
 * the server's one-sentence `message`.
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** The path of the API under the server's base URL. */
export const API_PATH = 'podman-hpc/api';

// --- what the server returns -------------------------------------------------

/** An image, local and/or squashed (engine/images/catalog.py `ImageInfo.as_dict`). */
export interface IImage {
  id: string;
  short_id: string;
  names: string[];
  size: number;
  created: string;
  local: boolean;
  squashed: boolean;
  stores: string;
}

/** Progress of a long operation (engine/progress.py `Progress` + fraction). */
export interface IProgress {
  stage: string;
  message: string;
  current: number | null;
  total: number | null;
  item: string;
  fraction: number | null;
}

// 'interrupted': its server stopped while it ran (a later server lists it so)
export type TaskState = 'queued' | 'running' | 'succeeded' | 'failed' | 'cancelled' | 'interrupted';

export const FINISHED_TASK_STATES: ReadonlyArray<string> = ['succeeded', 'failed', 'cancelled', 'interrupted'];

/** A background pull, build or squash (server/tasks.py `Task.as_dict`). */
export interface ITask {
  id: string;
  kind: string; // "pull", "build", "squash"
  title: string;
  state: TaskState;
  created: number;
  finished: number | null;
  progress: IProgress | null;
  log: string[];
  result: { image?: string; id?: string; squashed?: boolean } | null;
  error: string | null;
}

/** Job states as the job API normalizes Slurm's. */
export type JobState = 'PENDING' | 'RUNNING' | 'COMPLETED' | 'FAILED' | 'CANCELLED' | 'TIMEOUT' | 'UNKNOWN';

/** slurm/client.py `JobStatus.as_dict`. */
export interface IJobStatus {
  job_id: string;
  state: JobState;
  raw_state: string;
  reason: string;
  exit_code: number | null;
  signal: number | null;
  nodelist: string;
  nodes: string[];
  elapsed: number | null;
  start: string | null;
  end: string | null;
  source: string;
  finished: boolean;
}

/** slurm/jobs.py `Job.as_dict`. */
export interface IJob {
  id: string;
  directory: string;
  name: string;
  submitted: string | number | null;
  script: string;
  spec: { [key: string]: any };
  run: { [key: string]: any } | null;
  status: IJobStatus | null;
  /** A notebook job's executed notebook (slurm/notebook.py `output_info`); null for other jobs. */
  output?: IJobOutput | null;
}

/** Rank 0's progress through a notebook (slurm/nbrecorder.py `progress_of`). */
export interface INotebookProgress {
  state: string | null;
  /** The cell rank 0 is in (1-based, all cells counted), while it runs. */
  cell: number | null;
  cells: number;
  updated: string | null;
  errors: { rank: number; cell: number; ename: string; evalue: string; node?: string }[];
}

/** Where a notebook job's output notebook is, and rank 0's progress. */
export interface IJobOutput {
  name: string;
  path: string;
  exists: boolean;
  size: number | null;
  modified: number | null;
  progress: INotebookProgress | null;
}

/** GET jobs/{id}/output: the output notebook as rank 0 last wrote it. */
export interface IJobOutputContent extends IJobOutput {
  id: string;
  content: any;
}

/** slurm/cluster.py `Cluster.as_dict`: a running interactive cluster. */
export interface ICluster {
  id: string;
  job_id: string;
  image: string | null;
  nodes: number | null;
  engines: number;
  registered: number;
  state: string;
  host: string;
  directory: string;
  job_state: string | null;
  nodelist: string;
}

/** GET jobs/{id}/logs. */
export interface IJobLogs {
  id: string;
  ranks: { [rank: string]: string };
  errors: { [rank: string]: string };
  batch: string;
}

/** What POST jobs accepts (slurm/spec.py `JobSpec`), as the UI sends it. */
export interface IJobSpec {
  image: string;
  notebook: string;
  nodes: number;
  tasks_per_node: number;
  gpus_per_node: number | null;
  time: string;
  partition: string | null;
  account: string | null;
  modules: string[];
  mode: string;
  /** The notebook's parameters: names to Python literals (checked by the server). */
  parameters?: { [name: string]: string };
}

/** A site module (engine/site/modules.py `Module.describe`). */
export interface IModule {
  name: string;
  flag: string;
  help: string;
  conflicts: string[];
  depends_on: string[];
  shared_run: boolean;
  hidden: boolean;
}

/** A Slurm partition (slurm/client.py `Partition.as_dict`). */
export interface IPartition {
  name: string;
  default: boolean;
  available: string;
  nodes: number;
  idle: number;
  allocated: number;
  other: number;
  time_limit: string;
  time_limit_seconds: number | null;
}

/** GET config (server/backend.py `Backend.ui_config`). */
export interface IUIConfig {
  defaults: {
    nodes: number;
    tasks_per_node: number;
    time: string;
    partition: string;
    account: string;
    mode: string;
  };
  limits: {
    max_nodes: number;
    max_tasks_per_node: number;
    max_containerfile_bytes: number;
  };
  modules: IModule[];
  module_error: string | null;
  partitions: IPartition[];
  slurm_error: string | null;
  squash_dir: string;
  job_root: string;
  modes: string[];
}

/** A container kernelspec (kernels/kernelspec.py `ContainerKernel.as_dict`). */
export interface IContainerKernel {
  name: string;
  display_name: string;
  image: string;
  modules: string[];
  podman_args: string[];
  path: string;
  pool: number | null;
  slurm: boolean;
}

/** A build request: the Containerfile's text or its path inside the server root. */
export interface IBuildRequest {
  tag: string;
  containerfile?: string;
  path?: string;
  context?: string;
  build_args?: { [name: string]: string };
  squash?: boolean;
}

// --- the client --------------------------------------------------------------

/** A failed call: `message` is the server's sentence (or what went wrong on the way). */
export class APIError extends Error {
  constructor(
    message: string,
    readonly status: number
  ) {
    super(message);
    this.name = 'APIError';
  }
}

function settings(): ServerConnection.ISettings {
  return ServerConnection.makeSettings();
}

/**
 * Call the API; the decoded JSON answer. Throws APIError with the server's
 * message for every non-2xx answer and for network failures.
 */
export async function requestAPI<T>(
  path: string,
  init: RequestInit = {},
  query: { [key: string]: string } = {}
): Promise<T> {
  const server = settings();
  let url = URLExt.join(server.baseUrl, API_PATH, path);
  const search = new URLSearchParams(query).toString();
  if (search) {
    url += `?${search}`;
  }
  if (init.body !== undefined && !init.headers) {
    init = { ...init, headers: { 'Content-Type': 'application/json' } };
  }
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, server);
  } catch (error) {
    throw new APIError(`cannot reach the Jupyter server: ${(error as Error)?.message ?? error}`, 0);
  }
  const text = await response.text();
  let data: any = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (!response.ok) {
    const message =
      (data && typeof data.message === 'string' && data.message) ||
      response.statusText ||
      `the server answered ${response.status}`;
    throw new APIError(message, response.status);
  }
  return data as T;
}

function post(body: unknown): RequestInit {
  return { method: 'POST', body: JSON.stringify(body) };
}

/** An image reference or a name as one path segment (references hold '/' and ':'). */
function segment(value: string): string {
  return encodeURIComponent(value);
}

/** Every endpoint, typed. */
export const api = {
  config: (): Promise<IUIConfig> => requestAPI<IUIConfig>('config'),

  images: async (): Promise<IImage[]> => (await requestAPI<{ images: IImage[] }>('images')).images,
  pull: (image: string, squash = true): Promise<ITask> => requestAPI<ITask>('images/pull', post({ image, squash })),
  build: (request: IBuildRequest): Promise<ITask> => requestAPI<ITask>('images/build', post(request)),
  squash: (image: string): Promise<ITask> => requestAPI<ITask>('images/squash', post({ image })),
  removeSquashed: (image: string): Promise<{ image: string; id: string; deleted: boolean }> =>
    requestAPI('images/squashed/' + segment(image), { method: 'DELETE' }),

  tasks: async (): Promise<ITask[]> => (await requestAPI<{ tasks: ITask[] }>('tasks')).tasks,
  task: (id: string): Promise<ITask> => requestAPI<ITask>(`tasks/${id}`),
  cancelTask: (id: string): Promise<ITask> => requestAPI<ITask>(`tasks/${id}`, { method: 'DELETE' }),

  jobs: async (): Promise<IJob[]> => (await requestAPI<{ jobs: IJob[] }>('jobs')).jobs,
  job: (id: string): Promise<IJob> => requestAPI<IJob>(`jobs/${segment(id)}`),
  preview: async (spec: IJobSpec): Promise<string> =>
    (
      await requestAPI<{ script: string }>('jobs', post(spec), {
        preview: '1'
      })
    ).script,
  submit: (spec: IJobSpec): Promise<IJob> => requestAPI<IJob>('jobs', post(spec)),
  cancelJob: (id: string): Promise<IJob> => requestAPI<IJob>(`jobs/${segment(id)}`, { method: 'DELETE' }),
  jobLogs: (id: string): Promise<IJobLogs> => requestAPI<IJobLogs>(`jobs/${segment(id)}/logs`),
  jobOutput: (id: string): Promise<IJobOutputContent> => requestAPI<IJobOutputContent>(`jobs/${segment(id)}/output`),

  clusters: async (): Promise<ICluster[]> => (await requestAPI<{ clusters: ICluster[] }>('clusters')).clusters,
  stopCluster: (id: string): Promise<ICluster> => requestAPI<ICluster>(`clusters/${segment(id)}`, { method: 'DELETE' }),

  kernels: async (): Promise<IContainerKernel[]> =>
    (await requestAPI<{ kernels: IContainerKernel[] }>('kernels')).kernels,
  installKernel: (
    image: string,
    displayName?: string,
    modules: string[] = [],
    pool?: number
  ): Promise<IContainerKernel> =>
    requestAPI<IContainerKernel>('kernels', post({ image, display_name: displayName, modules, pool })),
  removeKernel: (name: string): Promise<IContainerKernel> =>
    requestAPI<IContainerKernel>(`kernels/${segment(name)}`, {
      method: 'DELETE'
    })
};

// --- task events ---------------------------------------------------------------

/** What a task's event stream reports. */
export interface ITaskHandlers {
  state?: (state: TaskState, data: { result?: any; error?: string | null }) => void;
  progress?: (progress: IProgress) => void;
  log?: (line: string) => void;
  /** The task has finished (called once), with its final record. */
  done?: (task: ITask) => void;
  /** Following the task failed (the stream and the polling fallback). */
  error?: (error: Error) => void;
}

/** A subscription to a task's events; `dispose()` stops it. */
export interface ITaskWatch {
  dispose(): void;
}

/** Lines of `log` after those already seen (the record keeps only the last lines). */
export function unseenLines(seen: string[], log: string[]): string[] {
  if (!seen.length) {
    return log;
  }
  // the longest suffix of `seen` that is a prefix of `log`
  for (let k = Math.min(seen.length, log.length); k > 0; k--) {
    let match = true;
    for (let i = 0; i < k; i++) {
      if (seen[seen.length - k + i] !== log[i]) {
        match = false;
        break;
      }
    }
    if (match) {
      return log.slice(k);
    }
  }
  return log;
}

/**
 * Follow a task: server-sent events from `GET tasks/{id}/events` (which the
 * browser resumes with Last-Event-ID after a network hiccup) or, should the
 * stream be refused, polling of `GET tasks/{id}` every second. The stream is
 * closed as soon as the task has finished (else EventSource would reconnect).
 */
export function watchTask(id: string, handlers: ITaskHandlers): ITaskWatch {
  let disposed = false;
  let finished = false;
  let source: EventSource | null = null;
  let timer: number | null = null;
  let received = false;
  let seen: string[] = [];

  const finish = async () => {
    if (finished || disposed) {
      return;
    }
    finished = true;
    source?.close();
    try {
      const task = await api.task(id);
      if (!disposed) {
        handlers.done?.(task);
      }
    } catch (error) {
      handlers.error?.(error as Error);
    }
  };

  const poll = async (skipExisting: boolean) => {
    if (disposed || finished) {
      return;
    }
    try {
      const task = await api.task(id);
      if (disposed) {
        return;
      }
      if (!skipExisting) {
        unseenLines(seen, task.log).forEach(line => handlers.log?.(line));
      }
      seen = task.log.slice();
      if (task.progress) {
        handlers.progress?.(task.progress);
      }
      handlers.state?.(task.state, { result: task.result, error: task.error });
      if (FINISHED_TASK_STATES.includes(task.state)) {
        await finish();
        return;
      }
    } catch (error) {
      handlers.error?.(error as Error);
      return;
    }
    timer = window.setTimeout(() => void poll(false), 1000);
  };

  const server = settings();
  let url = URLExt.join(server.baseUrl, API_PATH, 'tasks', id, 'events');
  if (server.token) {
    // EventSource sends no headers: the token goes in the query (the login cookie works too)
    url += `?token=${encodeURIComponent(server.token)}`;
  }
  try {
    source = new EventSource(url, { withCredentials: true });
  } catch {
    source = null;
  }
  if (!source) {
    void poll(false);
  } else {
    const parse = (event: Event): any => {
      received = true;
      try {
        return JSON.parse((event as MessageEvent).data);
      } catch {
        return {};
      }
    };
    source.addEventListener('state', event => {
      const data = parse(event);
      handlers.state?.(data.state, data);
      if (FINISHED_TASK_STATES.includes(data.state)) {
        void finish();
      }
    });
    source.addEventListener('progress', event => {
      handlers.progress?.(parse(event) as IProgress);
    });
    source.addEventListener('log', event => {
      const data = parse(event);
      if (typeof data.line === 'string') {
        handlers.log?.(data.line);
      }
    });
    source.onerror = () => {
      if (disposed || finished || !source) {
        return;
      }
      if (source.readyState === EventSource.CLOSED) {
        // refused (403, 404, not an event stream): follow the task by polling;
        // lines the stream already gave are not reported twice
        source = null;
        void poll(received);
      }
      // CONNECTING: the browser reconnects by itself, with Last-Event-ID
    };
  }

  return {
    dispose: () => {
      disposed = true;
      source?.close();
      if (timer !== null) {
        window.clearTimeout(timer);
      }
    }
  };
}
