/**
 * Small helpers shared by the widgets: DOM building, formatting, and the
 * checks the "Run at scale" form makes before anything reaches the server
 * (the same rules as jupyter_podman_hpc/slurm/spec.py, which checks again).
 */

import { LabIcon } from '@jupyterlab/ui-components';

type Child = Node | string | null | undefined | false;

/** `document.createElement` with attributes and children; `class` sets className. */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: { [name: string]: string | boolean | number | undefined | null } = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) {
      continue;
    }
    if (name === 'class') {
      node.className = String(value);
    } else if (value === true) {
      node.setAttribute(name, '');
    } else {
      node.setAttribute(name, String(value));
    }
  }
  append(node, ...children);
  return node;
}

export function append(node: HTMLElement, ...children: Child[]): void {
  for (const child of children) {
    if (child === null || child === undefined || child === false) {
      continue;
    }
    node.append(child);
  }
}

/** A small button with a text label (and optionally an icon), keyboard reachable as every <button>. */
export function button(
  label: string,
  onClick: (event: MouseEvent) => void,
  options: {
    title?: string;
    icon?: LabIcon;
    className?: string;
    accept?: boolean;
    iconOnly?: boolean;
  } = {}
): HTMLButtonElement {
  const node = h('button', {
    type: 'button',
    class: [
      'jp-PodmanHpc-button',
      options.accept ? 'jp-mod-accept' : '',
      options.iconOnly ? 'jp-PodmanHpc-iconButton' : '',
      options.className ?? ''
    ]
      .filter(Boolean)
      .join(' '),
    title: options.title ?? (options.iconOnly ? label : undefined),
    'aria-label': options.iconOnly ? label : undefined
  });
  if (options.icon) {
    node.append(options.icon.element({ tag: 'span', className: 'jp-PodmanHpc-buttonIcon' }));
  }
  if (!options.iconOnly) {
    node.append(h('span', { class: 'jp-PodmanHpc-buttonLabel' }, label));
  }
  node.addEventListener('click', onClick);
  return node;
}

/** Set a node's text only when it changed (no needless reflows while polling). */
export function setText(node: HTMLElement, text: string): void {
  if (node.textContent !== text) {
    node.textContent = text;
  }
}

export function setAttr(node: HTMLElement, name: string, value: string): void {
  if (node.getAttribute(name) !== value) {
    node.setAttribute(name, value);
  }
}

/** 1234567 -> "1.2 MB" (powers of 1000, as podman prints sizes). */
export function formatBytes(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined || !isFinite(bytes)) {
    return '';
  }
  const units = ['B', 'kB', 'MB', 'GB', 'TB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1000 && unit < units.length - 1) {
    value /= 1000;
    unit++;
  }
  return `${value < 10 && unit ? value.toFixed(1) : Math.round(value)} ${units[unit]}`;
}

/** Seconds -> "0:07", "12:03", "1:02:03", "2-01:02:03" (as squeue prints elapsed time). */
export function formatElapsed(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) {
    return '–';
  }
  const s = Math.max(0, Math.floor(seconds));
  const days = Math.floor(s / 86400);
  const hours = Math.floor((s % 86400) / 3600);
  const minutes = Math.floor((s % 3600) / 60);
  const secs = s % 60;
  const two = (n: number) => String(n).padStart(2, '0');
  if (days) {
    return `${days}-${two(hours)}:${two(minutes)}:${two(secs)}`;
  }
  if (hours) {
    return `${hours}:${two(minutes)}:${two(secs)}`;
  }
  return `${minutes}:${two(secs)}`;
}

// --- Slurm time limits (slurm/spec.py duration_seconds) -------------------------

const TIME_FORMS: RegExp[] = [
  /^(?<m>\d+)$/,
  /^(?<m>\d+):(?<s>\d{1,2})$/,
  /^(?<h>\d+):(?<m>\d{1,2}):(?<s>\d{1,2})$/,
  /^(?<d>\d+)-(?<h>\d{1,2})$/,
  /^(?<d>\d+)-(?<h>\d{1,2}):(?<m>\d{1,2})$/,
  /^(?<d>\d+)-(?<h>\d{1,2}):(?<m>\d{1,2}):(?<s>\d{1,2})$/
];

export const TIME_HELP = 'use minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED';

/**
 * Seconds in a Slurm time limit (`1-02:03:04`, `05:06`, `7` minutes), null
 * for UNLIMITED; undefined when the text is not a time limit.
 */
export function durationSeconds(text: string): number | null | undefined {
  const value = text.trim();
  if (['UNLIMITED', 'INFINITE'].includes(value.toUpperCase())) {
    return null;
  }
  for (const form of TIME_FORMS) {
    const match = form.exec(value);
    if (!match || !match.groups) {
      continue;
    }
    const parts: { [key: string]: number } = {};
    for (const [key, part] of Object.entries(match.groups)) {
      if (part !== undefined) {
        parts[key] = parseInt(part, 10);
      }
    }
    const leading = ['d', 'h', 'm', 's'].find(key => key in parts);
    const limits: { [key: string]: number } = { h: 24, m: 60, s: 60 };
    for (const [key, limit] of Object.entries(limits)) {
      if (key in parts && key !== leading && parts[key] >= limit) {
        return undefined;
      }
    }
    return (parts.d ?? 0) * 86400 + (parts.h ?? 0) * 3600 + (parts.m ?? 0) * 60 + (parts.s ?? 0);
  }
  return undefined;
}

/** Slurm names (account, ...): letters, digits and _ . + @ : - */
export const SLURM_NAME = /^[A-Za-z0-9_.+@:-]+$/;

/** A whole number in a form field, or null if the text is not one. */
export function wholeNumber(text: string): number | null {
  const value = text.trim();
  if (!/^\d+$/.test(value)) {
    return null;
  }
  return parseInt(value, 10);
}

/** An image reference compared loosely: "busybox" and "busybox:latest" are one. */
export function sameImage(a: string, b: string): boolean {
  const norm = (ref: string) => {
    const name = ref.trim();
    const lastSlash = name.lastIndexOf('/');
    const tail = name.slice(lastSlash + 1);
    return tail.includes(':') || tail.includes('@') ? name : `${name}:latest`;
  };
  return norm(a) === norm(b);
}

/** The message of anything thrown. */
export function messageOf(error: unknown): string {
  if (error instanceof Error) {
    return error.message;
  }
  return String(error);
}

/**
 * Show one row per item in `list`, in the items' order, reusing the rows of
 * `rows` (by key): rows are updated in place and moved only when out of
 * place, so a refresh keeps focus, scroll and open details.
 */
export function reconcileRows<T, R extends { node: HTMLElement; update(item: T): void }>(
  list: HTMLElement,
  rows: Map<string, R>,
  items: T[],
  keyOf: (item: T) => string,
  create: (item: T) => R
): void {
  const seen = new Set<string>();
  let previous: HTMLElement | null = null;
  for (const item of items) {
    const key = keyOf(item);
    seen.add(key);
    let row = rows.get(key);
    if (row) {
      row.update(item);
    } else {
      row = create(item);
      rows.set(key, row);
    }
    const expected: Element | null = previous ? previous.nextElementSibling : list.firstElementChild;
    if (expected !== row.node) {
      list.insertBefore(row.node, expected);
    }
    previous = row.node;
  }
  for (const [key, row] of rows) {
    if (!seen.has(key)) {
      row.node.remove();
      rows.delete(key);
    }
  }
}
