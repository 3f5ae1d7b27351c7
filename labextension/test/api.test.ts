/**
 * src/api.ts: how a task's log is resumed (unseenLines), and what requestAPI
 * makes of the server's answers. The server is replaced by a stub of
 * ServerConnection.makeRequest answering with real fetch Responses.
 */

import { ServerConnection } from '@jupyterlab/services';

import { api, APIError, requestAPI, unseenLines } from '../src/api';

describe('unseenLines', () => {
  it('gives the whole log when nothing was seen yet', () => {
    expect(unseenLines([], ['a', 'b'])).toEqual(['a', 'b']);
  });

  it('gives the lines after those seen', () => {
    expect(unseenLines(['a', 'b'], ['a', 'b', 'c', 'd'])).toEqual(['c', 'd']);
  });

  it('follows a log whose oldest lines were dropped (the record keeps only the last lines)', () => {
    expect(unseenLines(['a', 'b', 'c'], ['b', 'c', 'd', 'e'])).toEqual(['d', 'e']);
  });

  it('gives nothing when the log did not grow', () => {
    expect(unseenLines(['a', 'b'], ['a', 'b'])).toEqual([]);
    expect(unseenLines(['a'], [])).toEqual([]);
  });

  it('takes the longest overlap when lines repeat', () => {
    expect(unseenLines(['x', 'x'], ['x', 'x', 'x'])).toEqual(['x']);
    expect(unseenLines(['a', 'x', 'x'], ['x', 'x', 'y'])).toEqual(['y']);
  });

  it('gives the whole log when it shares nothing with what was seen (it moved on by a full window)', () => {
    expect(unseenLines(['a', 'b'], ['c', 'd'])).toEqual(['c', 'd']);
  });

  it('does not take a match in the middle of what was seen for an overlap', () => {
    expect(unseenLines(['a', 'b', 'c'], ['b', 'x'])).toEqual(['b', 'x']);
  });
});

describe('requestAPI', () => {
  const BASE = 'http://jupyter.test/user/me/';
  let makeRequest: jest.SpyInstance;

  // a new Response per call: a body can be read once
  const answer = (body: string | null, init: ResponseInit = {}) =>
    makeRequest.mockImplementation(async () => new Response(body, init));
  const called = (): { url: string; init: RequestInit } => {
    const [url, init] = makeRequest.mock.calls[makeRequest.mock.calls.length - 1];
    return { url, init };
  };
  const failure = async (promise: Promise<unknown>): Promise<APIError> => {
    try {
      await promise;
    } catch (error) {
      expect(error).toBeInstanceOf(APIError);
      return error as APIError;
    }
    throw new Error('the call did not fail');
  };

  beforeEach(() => {
    jest.spyOn(ServerConnection, 'makeSettings').mockReturnValue({ baseUrl: BASE } as ServerConnection.ISettings);
    makeRequest = jest.spyOn(ServerConnection, 'makeRequest');
  });

  afterEach(() => {
    jest.restoreAllMocks();
  });

  it('decodes the JSON answer of a path under the base URL, with the query', async () => {
    answer('{"script": "#!/bin/bash"}', { status: 200 });
    await expect(requestAPI('jobs', {}, { preview: '1', image: 'a b' })).resolves.toEqual({ script: '#!/bin/bash' });
    expect(called().url).toBe(`${BASE}podman-hpc/api/jobs?preview=1&image=a+b`);
  });

  it('sends a body as JSON unless the caller set headers', async () => {
    answer('{}');
    await requestAPI('jobs', { method: 'POST', body: '{}' });
    expect(called().init.headers).toEqual({ 'Content-Type': 'application/json' });
    await requestAPI('jobs', { method: 'POST', body: 'x', headers: { 'Content-Type': 'text/plain' } });
    expect(called().init.headers).toEqual({ 'Content-Type': 'text/plain' });
  });

  it('gives null for an empty answer (204) and for one that is not JSON', async () => {
    answer(null, { status: 204 });
    await expect(requestAPI('tasks/1', { method: 'DELETE' })).resolves.toBeNull();
    answer('<html>proxy page</html>', { status: 200 });
    await expect(requestAPI('config')).resolves.toBeNull();
  });

  it("throws the server's one-sentence message with the status", async () => {
    answer('{"message": "image busybox is not squashed"}', { status: 400, statusText: 'Bad Request' });
    const error = await failure(requestAPI('jobs'));
    expect(error.message).toBe('image busybox is not squashed');
    expect(error.status).toBe(400);
    expect(error.name).toBe('APIError');
  });

  it.each([
    ['an HTML error page', '<h1>Bad Gateway</h1>'],
    ['JSON without a message', '{"reason": "x"}'],
    ['a message that is not text', '{"message": 42}'],
    ['an empty message', '{"message": ""}']
  ])('falls back on the status text for %s', async (_what, body) => {
    answer(body, { status: 502, statusText: 'Bad Gateway' });
    const error = await failure(requestAPI('images'));
    expect(error.message).toBe('Bad Gateway');
    expect(error.status).toBe(502);
  });

  it('names the status when there is no status text either (HTTP/2)', async () => {
    answer('', { status: 503 });
    expect((await failure(requestAPI('images'))).message).toBe('the server answered 503');
  });

  it('turns a network failure into status 0 with what went wrong', async () => {
    makeRequest.mockRejectedValue(new TypeError('Failed to fetch'));
    const error = await failure(requestAPI('images'));
    expect(error.message).toBe('cannot reach the Jupyter server: Failed to fetch');
    expect(error.status).toBe(0);
  });
});

describe('api endpoints', () => {
  let makeRequest: jest.SpyInstance;
  const BASE = 'http://jupyter.test/';

  beforeEach(() => {
    jest.spyOn(ServerConnection, 'makeSettings').mockReturnValue({ baseUrl: BASE } as ServerConnection.ISettings);
    makeRequest = jest.spyOn(ServerConnection, 'makeRequest');
  });

  afterEach(() => {
    jest.restoreAllMocks();
  });

  const reply = (data: unknown) => makeRequest.mockImplementation(async () => new Response(JSON.stringify(data)));

  it('puts an image reference in one path segment (it holds / and :)', async () => {
    reply({});
    await api.removeSquashed('localhost/app:1.0');
    const [url, init] = makeRequest.mock.calls[0];
    expect(url).toBe(`${BASE}podman-hpc/api/images/squashed/localhost%2Fapp%3A1.0`);
    expect(init.method).toBe('DELETE');
  });

  it('encodes ids and names it puts in a path', async () => {
    reply({});
    await api.job('12/../34');
    await api.removeKernel('podman hpc');
    expect(makeRequest.mock.calls.map(call => call[0])).toEqual([
      `${BASE}podman-hpc/api/jobs/12%2F..%2F34`,
      `${BASE}podman-hpc/api/kernels/podman%20hpc`
    ]);
  });

  it('unwraps the lists the server returns in an object', async () => {
    reply({ images: [{ id: 'a' }], tasks: [], jobs: [{ id: '1' }], clusters: [], kernels: [] });
    await expect(api.images()).resolves.toEqual([{ id: 'a' }]);
    await expect(api.jobs()).resolves.toEqual([{ id: '1' }]);
  });

  it('posts what the server expects for a kernel and a pull', async () => {
    reply({});
    await api.installKernel('img:1', 'My kernel', ['mpich'], 2);
    await api.pull('busybox');
    const bodies = makeRequest.mock.calls.map(call => JSON.parse(call[1].body));
    expect(bodies).toEqual([
      { image: 'img:1', display_name: 'My kernel', modules: ['mpich'], pool: 2 },
      { image: 'busybox', squash: true }
    ]);
  });

  it('asks for a preview with ?preview=1 and gives the script', async () => {
    reply({ script: '#!/bin/bash\n' });
    const spec = {
      image: 'i',
      notebook: 'n.ipynb',
      nodes: 1,
      tasks_per_node: 1,
      gpus_per_node: null,
      time: '10',
      partition: null,
      account: null,
      modules: [],
      mode: 'mpi'
    };
    await expect(api.preview(spec)).resolves.toBe('#!/bin/bash\n');
    expect(makeRequest.mock.calls[0][0]).toBe(`${BASE}podman-hpc/api/jobs?preview=1`);
  });
});
