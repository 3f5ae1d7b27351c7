// Stands in for the JupyterLab and Lumino UI packages, which load only in a
// browser (they touch `navigator` or import CSS on load). Every name the
// source imports from them is an empty class: enough for the modules under
// test to load and declare their widgets, which the tests never construct.
const classes = new Map();

module.exports = new Proxy(
  {},
  {
    get(_target, name) {
      if (name === '__esModule') {
        return true;
      }
      if (typeof name !== 'string' || name === 'then') {
        return undefined;
      }
      if (!classes.has(name)) {
        classes.set(name, class {});
      }
      return classes.get(name);
    }
  }
);
