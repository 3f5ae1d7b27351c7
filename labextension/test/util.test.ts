/**
 * The formatting and form checks of src/util.ts. The time limits are those of
 * jupyter_podman_hpc/slurm/spec.py `duration_seconds`, which checks again on
 * the server: the cases below are the forms sbatch --time reads.
 */

import {
  durationSeconds,
  formatBytes,
  formatElapsed,
  messageOf,
  sameImage,
  SLURM_NAME,
  wholeNumber
} from '../src/util';

describe('formatBytes', () => {
  it.each([
    [0, '0 B'],
    [999, '999 B'],
    [1000, '1.0 kB'],
    [1234567, '1.2 MB'],
    [12345, '12 kB'],
    [987654321, '988 MB'],
    [3.5e12, '3.5 TB']
  ])('%p bytes -> %p (powers of 1000, one decimal under 10)', (bytes, text) => {
    expect(formatBytes(bytes)).toBe(text);
  });

  it('stops at TB rather than inventing a unit', () => {
    expect(formatBytes(5e15)).toBe('5000 TB');
  });

  it.each([null, undefined, NaN, Infinity])('shows nothing for %p (a size podman did not report)', bytes => {
    expect(formatBytes(bytes)).toBe('');
  });
});

describe('formatElapsed', () => {
  it.each([
    [0, '0:00'],
    [7, '0:07'],
    [59.9, '0:59'],
    [723, '12:03'],
    [3723, '1:02:03'],
    [86400, '1-00:00:00'],
    [2 * 86400 + 3723, '2-01:02:03']
  ])('%p s -> %p (as squeue prints it)', (seconds, text) => {
    expect(formatElapsed(seconds)).toBe(text);
  });

  it('clamps a negative time (clock skew between nodes) to zero', () => {
    expect(formatElapsed(-5)).toBe('0:00');
  });

  it.each([null, undefined, NaN, -Infinity])('shows a dash for %p (not started)', seconds => {
    expect(formatElapsed(seconds)).toBe('–');
  });
});

describe('durationSeconds', () => {
  it.each([
    ['7', 7 * 60],
    ['90', 90 * 60],
    ['05:06', 5 * 60 + 6],
    ['1:02:03', 3723],
    ['1:2:3', 3723],
    ['1-02', 86400 + 2 * 3600],
    ['1-02:03', 86400 + 2 * 3600 + 3 * 60],
    ['1-02:03:04', 86400 + 2 * 3600 + 3 * 60 + 4],
    ['  30  ', 30 * 60],
    ['0', 0]
  ])('%p is %p s', (text, seconds) => {
    expect(durationSeconds(text)).toBe(seconds);
  });

  it('lets the leading field exceed its range, as Slurm does', () => {
    expect(durationSeconds('100:00')).toBe(6000);
    expect(durationSeconds('25:00:00')).toBe(25 * 3600);
    expect(durationSeconds('40-00')).toBe(40 * 86400);
  });

  it.each(['UNLIMITED', 'unlimited', ' Infinite '])('%p is no limit (null)', text => {
    expect(durationSeconds(text)).toBeNull();
  });

  it.each([
    ['', 'empty'],
    ['abc', 'not a number'],
    ['1.5', 'a fraction'],
    ['-5', 'negative'],
    ['1h', 'a unit'],
    ['1:60', 'seconds out of range'],
    ['1:60:00', 'minutes out of range'],
    ['1-24', 'hours out of range after days'],
    ['1-00:00:60', 'seconds out of range after days'],
    ['1:02:03:04', 'four colon fields'],
    ['1-02:03:04:05', 'too many fields'],
    ['1:123', 'three-digit seconds'],
    ['1-', 'days alone'],
    ['UNLIMITEDX', 'almost UNLIMITED']
  ])('%p is not a time limit (%s): undefined', text => {
    expect(durationSeconds(text)).toBeUndefined();
  });
});

describe('SLURM_NAME', () => {
  it.each(['acct', 'my_acct.1', 'a+b@c:d-e'])('accepts %p', name => {
    expect(SLURM_NAME.test(name)).toBe(true);
  });

  it.each(['', 'a b', 'a;rm -rf', 'a/b', "o'brien", 'a\nb', 'naïve'])('refuses %p', name => {
    expect(SLURM_NAME.test(name)).toBe(false);
  });
});

describe('wholeNumber', () => {
  it.each([
    ['0', 0],
    ['12', 12],
    [' 4 ', 4],
    ['007', 7]
  ])('%p -> %p', (text, value) => {
    expect(wholeNumber(text)).toBe(value);
  });

  it.each(['', ' ', '-1', '+1', '1.5', '1e3', '12a', '0x10', '١٢'])('%p is not a whole number', text => {
    expect(wholeNumber(text)).toBeNull();
  });
});

describe('sameImage', () => {
  it.each([
    ['busybox', 'busybox:latest'],
    [' busybox ', 'busybox'],
    ['localhost:5000/busybox', 'localhost:5000/busybox:latest'],
    ['docker.io/library/python:3.12', 'docker.io/library/python:3.12'],
    ['img@sha256:abcd', 'img@sha256:abcd']
  ])('%p and %p are one image', (a, b) => {
    expect(sameImage(a, b)).toBe(true);
    expect(sameImage(b, a)).toBe(true);
  });

  it.each([
    ['busybox', 'busybox:1.36'],
    ['busybox', 'docker.io/library/busybox'],
    ['localhost:5000/busybox', 'localhost:5000/busybox:5000'],
    ['img@sha256:abcd', 'img'],
    ['python:3.12', 'python:3.11']
  ])('%p and %p differ', (a, b) => {
    expect(sameImage(a, b)).toBe(false);
  });
});

describe('messageOf', () => {
  it('gives an Error its message, not its name', () => {
    expect(messageOf(new TypeError('bad input'))).toBe('bad input');
  });

  it.each([
    ['a string', 'a string'],
    [42, '42'],
    [undefined, 'undefined'],
    [null, 'null']
  ])('turns a thrown %p into %p', (thrown, text) => {
    expect(messageOf(thrown)).toBe(text);
  });
});
