// jest for the extension's pure functions, in Node (no browser, no JupyterLab).
// The tests live in test/, outside tsconfig.json's src/*, so tsc and the built
// extension never see them; tsconfig.test.json type-checks them with the sources.
module.exports = {
  testEnvironment: 'node',
  roots: ['<rootDir>/test'],
  transform: { '^.+\\.ts$': ['ts-jest', { tsconfig: 'tsconfig.test.json' }] },
  moduleNameMapper: {
    '^@jupyterlab/(application|apputils|codeeditor|docregistry|filebrowser|notebook|rendermime|settingregistry|ui-components)$':
      '<rootDir>/test/stubs/lab.js',
    '^@lumino/widgets$': '<rootDir>/test/stubs/lab.js'
  }
};
