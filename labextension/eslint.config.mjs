// eslint for the extension's TypeScript (flat config). The rule set is the
// recommended sets of eslint and typescript-eslint, with formatting left to
// prettier (eslint-config-prettier), plus the JupyterLab extension
// template's few house rules. Every rule turned off says why.
import js from '@eslint/js';
import prettier from 'eslint-config-prettier';
import { defineConfig } from 'eslint/config';
import tseslint from 'typescript-eslint';

export default defineConfig(
  { ignores: ['lib/', 'node_modules/', 'coverage/'] },
  js.configs.recommended,
  tseslint.configs.recommended,
  prettier,
  {
    files: ['**/*.ts'],
    rules: {
      // JupyterLab's convention, which every interface here follows: IJob, ITask, ...
      '@typescript-eslint/naming-convention': [
        'error',
        { selector: 'interface', format: ['PascalCase'], custom: { regex: '^I[A-Z]', match: true } }
      ],
      curly: ['error', 'all'],
      eqeqeq: 'error',
      'prefer-arrow-callback': 'error',
      // Off: the server's JSON is typed only where the UI reads it; a job's `spec` and `run`
      // and a notebook's content are passed through as the server sent them (api.ts says which).
      '@typescript-eslint/no-explicit-any': 'off',
      // Off: `namespace CommandIDs` is how JupyterLab extensions name their commands.
      '@typescript-eslint/no-namespace': 'off'
    }
  },
  {
    // jest.config.js is loaded by jest with require(): CommonJS in Node.
    files: ['**/*.js'],
    languageOptions: { sourceType: 'commonjs', globals: { module: 'writable', require: 'readonly' } }
  }
);
