/**
 * The Containers panel's "Clusters" section: the running interactive clusters
 * (IPython Parallel engines started by `%podman_hpc cluster start` in any of
 * the user's kernels), polled with GET clusters; each shows its job state,
 * registered / started engines and nodes, and a Stop button (DELETE
 * clusters/{id}: the engines, job, controller and connection files go).
 */

import { Dialog, showDialog, showErrorMessage } from '@jupyterlab/apputils';
import { api, ICluster } from './api';
import { PolledSection } from './polled';
import { Settings } from './settings';
import { button, h, messageOf, reconcileRows, setAttr, setText } from './util';

class ClusterRow {
  readonly node: HTMLElement;
  cluster: ICluster;
  private _badge: HTMLElement;
  private _engines: HTMLElement;
  private _nodes: HTMLElement;
  private _stop: HTMLButtonElement;

  constructor(cluster: ICluster, section: ClustersSection) {
    this.cluster = cluster;
    this._badge = h('span', { class: 'jp-PodmanHpc-badge jp-PodmanHpc-state' });
    this._engines = h('span', { class: 'jp-PodmanHpc-clusterEngines' });
    this._nodes = h('span', { class: 'jp-PodmanHpc-jobNodes' });
    this._stop = button('Stop', () => void section.stop(this.cluster), {
      className: 'jp-PodmanHpc-stopCluster',
      title: 'Stop the engines, cancel the job and remove the controller'
    });
    this.node = h(
      'li',
      { class: 'jp-PodmanHpc-cluster', 'data-cluster-id': cluster.id },
      h(
        'div',
        { class: 'jp-PodmanHpc-jobHeader' },
        this._badge,
        h('span', { class: 'jp-PodmanHpc-jobName', title: cluster.directory }, cluster.image ?? ''),
        h('span', { class: 'jp-PodmanHpc-jobId' }, `#${cluster.job_id}`)
      ),
      h('div', { class: 'jp-PodmanHpc-jobMeta' }, this._engines, this._nodes),
      h('div', { class: 'jp-PodmanHpc-actions' }, this._stop)
    );
    this.update(cluster);
  }

  update(cluster: ICluster): void {
    this.cluster = cluster;
    const state = cluster.job_state ?? cluster.state.toUpperCase();
    setText(this._badge, state);
    setAttr(this._badge, 'data-state', state.toLowerCase());
    setText(this._engines, `${cluster.registered}/${cluster.engines} engines`);
    setText(this._nodes, cluster.nodelist || `${cluster.nodes} nodes`);
    this._stop.disabled = cluster.state === 'stopped';
  }
}

export class ClustersSection extends PolledSection {
  private _rows = new Map<string, ClusterRow>();

  constructor(settings: Settings) {
    super({ settings, name: 'clusters', label: 'Clusters', listLabel: 'Interactive clusters' });
  }

  protected async fetch(): Promise<void> {
    let clusters: ICluster[];
    try {
      clusters = await api.clusters();
    } catch (error) {
      this.showStatus(`Cannot list the clusters: ${messageOf(error)}`, true);
      throw error;
    }
    reconcileRows(
      this.list,
      this._rows,
      clusters,
      c => c.id,
      c => new ClusterRow(c, this)
    );
    this.showStatus(clusters.length ? '' : 'No running cluster: choose “Interactive cluster” in “Run at scale”.');
  }

  async stop(cluster: ICluster): Promise<void> {
    const answer = await showDialog({
      title: `Stop cluster ${cluster.id}`,
      body: `Stop its ${cluster.engines} engines (job ${cluster.job_id}) and its controller? Clients connected to it lose it.`,
      buttons: [Dialog.cancelButton({ label: 'Keep it' }), Dialog.warnButton({ label: 'Stop cluster' })]
    });
    if (!answer.button.accept) {
      return;
    }
    try {
      this._rows.get(cluster.id)?.update(await api.stopCluster(cluster.id));
    } catch (error) {
      void showErrorMessage(`Cannot stop cluster ${cluster.id}`, messageOf(error));
    }
    void this.refresh();
  }
}
