/**
 * The extension's icons, as LabIcons (the `jp-icon3` class lets every theme recolour them).
 */

import { LabIcon } from '@jupyterlab/ui-components';

/** A 16-pixel icon named `jupyter-podman-hpc:<name>`, drawn by one path in a 24×24 box. */
function icon(name: string, path: string): LabIcon {
  return new LabIcon({
    name: `jupyter-podman-hpc:${name}`,
    svgstr: `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="${path}"/>
  </g>
</svg>`
  });
}

/** A box: the Containers panel. */
export const containersIcon = icon(
  'containers',
  'M12 2.2 3 6.3v11.4l9 4.1 9-4.1V6.3L12 2.2zm0 2.2 6.3 2.9L12 10.1 5.7 7.3 12 4.4zM5 8.9l6 2.7v7.6l-6-2.7V8.9zm8 10.3v-7.6l6-2.7v7.6l-6 2.7z'
);

/** Four nodes: "Run at scale". */
export const scaleIcon = icon(
  'scale',
  'M3 3h7v7H3V3zm2 2v3h3V5H5zm9-2h7v7h-7V3zm2 2v3h3V5h-3zM3 14h7v7H3v-7zm2 2v3h3v-3H5zm9-2h7v7h-7v-7zm2 2v3h3v-3h-3z'
);
