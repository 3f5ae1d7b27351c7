/**
 * The pure helpers of the dialogs and views: the Containerfile name rules and
 * proposed tag (build.ts), what a job is called (logs.ts), the progress line
 * and the trust stripping of an output notebook (output.ts), and the cell and
 * image list of "Run at scale" (runAtScale.ts). Their modules' widgets need a
 * browser; the JupyterLab UI packages are stubbed (test/stubs/lab.js).
 */

import { IImage, IJob, IJobOutput, IJobSpec, INotebookProgress } from '../src/api';
import { CONTAINERFILE_PATTERN, defaultTag, isContainerfile } from '../src/build';
import { jobLabel } from '../src/logs';
import { describeProgress, withoutTrust } from '../src/output';
import { clusterCode, squashedNames } from '../src/runAtScale';

describe('isContainerfile', () => {
  const containerfiles = [
    'Containerfile',
    'Dockerfile',
    'containerfile',
    'dir/sub/Dockerfile',
    'Containerfile.gpu',
    'Dockerfile.dev.arm64',
    'app.Containerfile',
    'dir/app.dockerfile'
  ];
  const others = [
    'README.md',
    'MyContainerfile',
    'Containerfiles',
    'Containerfile/notes.txt',
    'build.sh',
    'Dockerfile-old'
  ];

  it.each(containerfiles)('%p is a Containerfile', path => {
    expect(isContainerfile(path)).toBe(true);
  });

  it.each(others)('%p is not', path => {
    expect(isContainerfile(path)).toBe(false);
  });

  it("agrees with the file type's pattern on the usual spellings", () => {
    const fileType = new RegExp(CONTAINERFILE_PATTERN);
    for (const path of [...containerfiles, ...others]) {
      const name = path.split('/').pop() as string;
      expect([name, fileType.test(name)]).toEqual([name, isContainerfile(name)]);
    }
  });
});

describe('defaultTag', () => {
  it.each([
    ['project/Containerfile', 'localhost/project:latest'],
    ['a/project/Dockerfile', 'localhost/project:latest'],
    ['project/app.Containerfile', 'localhost/app:latest'],
    ['project/Containerfile.gpu', 'localhost/gpu:latest'],
    ['Containerfile', 'localhost/image:latest'],
    ['My Project/Containerfile', 'localhost/my-project:latest'],
    ['x/Web_App.Dockerfile', 'localhost/web_app:latest'],
    ['__/Containerfile', 'localhost/image:latest'],
    ['ünïcode/Containerfile', 'localhost/n-code:latest']
  ])('%p -> %p (a reference podman accepts)', (path, tag) => {
    expect(defaultTag(path)).toBe(tag);
  });
});

describe('jobLabel', () => {
  const job = (spec: IJob['spec'], name = 'job-12'): IJob =>
    ({ id: '12', name, spec, directory: '/jobs/12', submitted: null, script: '', run: null, status: null }) as IJob;

  it("names a notebook job by the notebook's file name", () => {
    expect(jobLabel(job({ notebook: 'work/runs/train.ipynb' }))).toBe('train.ipynb');
  });

  it("names a script job by the script's file name", () => {
    expect(jobLabel(job({ python_script: 'scripts/run.py' }))).toBe('run.py');
  });

  it.each([
    ['no spec', undefined],
    ['an empty notebook', { notebook: '' }],
    ['a notebook that is not a path', { notebook: 42 }],
    ['neither', { image: 'x' }]
  ])("falls back on the record's name for %s", (_what, spec) => {
    expect(jobLabel(job(spec as IJob['spec']))).toBe('job-12');
  });
});

describe('describeProgress', () => {
  const output = (progress: Partial<INotebookProgress> | null, exists = true): IJobOutput => ({
    name: 'out.ipynb',
    path: 'jobs/1/out/out.ipynb',
    exists,
    size: null,
    modified: null,
    progress: progress && { state: null, cell: null, cells: 5, updated: null, errors: [], ...progress }
  });

  it('says nothing for a job without an output notebook', () => {
    expect(describeProgress(null)).toBe('');
    expect(describeProgress(undefined)).toBe('');
  });

  it('says "not started" before rank 0 wrote the notebook', () => {
    expect(describeProgress(output(null, false))).toBe('not started');
  });

  it('says which cell rank 0 is in', () => {
    expect(describeProgress(output({ state: 'running', cell: 2 }))).toBe('running cell 2 of 5');
  });

  it('says the state alone when the cell is not known', () => {
    expect(describeProgress(output({ state: 'running', cell: null }))).toBe('running');
    expect(describeProgress(output({ state: 'completed' }))).toBe('completed');
    expect(describeProgress(output({ state: null }))).toBe('');
  });

  it('names every failed cell and its rank, before the state', () => {
    const errors = [
      { rank: 0, cell: 3, ename: 'ValueError', evalue: 'x' },
      { rank: 5, cell: 4, ename: 'MPIError', evalue: 'y', node: 'nid001' }
    ];
    expect(describeProgress(output({ state: 'running', cell: 4, errors }))).toBe(
      'cell 3 failed on rank 0: ValueError; cell 4 failed on rank 5: MPIError'
    );
  });
});

describe('withoutTrust', () => {
  it('drops every cell\'s "trusted" flag and keeps the rest of the notebook', () => {
    const notebook = {
      nbformat: 4,
      metadata: { kernelspec: { name: 'python3' }, trusted: true },
      cells: [
        { cell_type: 'code', source: 'x', metadata: { trusted: true, tags: ['parameters'] }, outputs: [] },
        { cell_type: 'markdown', source: '# t', metadata: { trusted: false } },
        { cell_type: 'code', source: 'y', metadata: {} }
      ]
    };
    const stripped = withoutTrust(notebook);
    expect(stripped.cells.map((cell: any) => cell.metadata)).toEqual([{ tags: ['parameters'] }, {}, {}]);
    expect(stripped.cells[0].source).toBe('x');
    expect(stripped.nbformat).toBe(4);
    expect(stripped.metadata).toEqual(notebook.metadata);
  });

  it('leaves the notebook it was given untouched (it is the fetched JSON)', () => {
    const notebook = { cells: [{ metadata: { trusted: true } }] };
    withoutTrust(notebook);
    expect(notebook.cells[0].metadata.trusted).toBe(true);
  });

  it('gives a cell without metadata an empty one', () => {
    expect(withoutTrust({ cells: [{ cell_type: 'code' }] }).cells).toEqual([{ cell_type: 'code', metadata: {} }]);
  });

  it.each([
    ['null', null],
    ['no cells', { metadata: {} }],
    ['cells that are not a list', { cells: { 0: { metadata: { trusted: true } } } }]
  ])('gives no cells for %s (never a trusted one)', (_what, content) => {
    expect(withoutTrust(content).cells).toEqual([]);
  });
});

describe('clusterCode', () => {
  const spec = (fields: Partial<IJobSpec> = {}): IJobSpec => ({
    image: 'localhost/app:latest',
    notebook: 'n.ipynb',
    nodes: 2,
    tasks_per_node: 4,
    gpus_per_node: null,
    time: '',
    partition: null,
    account: null,
    modules: [],
    mode: 'podman-exec',
    ...fields
  });
  const command = (code: string) => code.split('\n')[1];

  it('loads the magics, then starts the cluster with the form’s shape', () => {
    expect(clusterCode(spec())).toBe(
      '%load_ext jupyter_podman_hpc\ncluster = %podman_hpc cluster start --nodes 2 --tasks-per-node 4 localhost/app:latest'
    );
  });

  it('passes the options that are set, and every module', () => {
    const code = clusterCode(
      spec({ time: '1-00:00', partition: 'gpu', account: 'm1234', gpus_per_node: 4, modules: ['mpich', 'gpu'] })
    );
    expect(command(code)).toBe(
      'cluster = %podman_hpc cluster start --nodes 2 --tasks-per-node 4 --time 1-00:00 --partition gpu ' +
        '--account m1234 --gpus-per-node 4 --module mpich --module gpu localhost/app:latest'
    );
  });

  it('leaves out zero GPUs and an empty time', () => {
    expect(command(clusterCode(spec({ gpus_per_node: 0, time: '' })))).not.toMatch(/--gpus-per-node|--time/);
  });

  it('quotes words the shell-like magic parser would split or expand', () => {
    const code = clusterCode(spec({ account: "o'brien", partition: 'a b', image: 'img;$(id)' }));
    expect(command(code)).toBe(
      "cluster = %podman_hpc cluster start --nodes 2 --tasks-per-node 4 --partition 'a b' " +
        "--account 'o'\"'\"'brien' 'img;$(id)'"
    );
  });
});

describe('squashedNames', () => {
  const image = (names: string[], squashed: boolean): IImage => ({
    id: names[0] ?? 'x',
    short_id: 'x',
    names,
    size: 0,
    created: '',
    local: true,
    squashed,
    stores: ''
  });

  it('lists each name of the squashed images once, sorted', () => {
    const images = [
      image(['localhost/b:1', 'localhost/a:latest'], true),
      image(['localhost/a:latest'], true),
      image(['docker.io/library/busybox:latest'], false)
    ];
    expect(squashedNames(images)).toEqual(['localhost/a:latest', 'localhost/b:1']);
  });

  it('leaves out untagged and empty names', () => {
    expect(squashedNames([image(['<none>:<none>', 'localhost/<none>', '', 'ok:1'], true)])).toEqual(['ok:1']);
  });

  it('gives nothing when no image is squashed', () => {
    expect(squashedNames([image(['a:1'], false)])).toEqual([]);
  });
});
