// @ts-check
// Swagger UI (/docs) prints JSON with JSON.stringify(value, null, 2): a matrix there takes one
// line per number (a 3 × 3 matrix, 15 lines), in the worked examples ("Try it out") as in the
// answers. (An example's value given as text does not help: for a JSON body Swagger UI parses it
// and prints it again.) This plugin lays out the JSON Swagger UI wrote with one matrix row a line
// where it is shown: the request body editor and the code boxes (example values, answers). What
// Execute sends is the same JSON (Swagger UI's text, or the user's once edited); text a user typed
// is shown as it is; the OpenAPI document is unchanged. A classic script, not a module: the /docs
// page's inline configuration reads the global it defines.

/**
 * `value` as JSON text: an array or object that holds no array or object on one line (a matrix
 * row, a token list, {"type": "causal"}), any other one member a line, indented.
 * @param {unknown} value
 * @param {string} [indent]
 * @returns {string}
 */
function asRows(value, indent = "") {
  if (value === null || typeof value !== "object") return JSON.stringify(value);
  const inner = indent + "  ";
  const list = Array.isArray(value);
  const members = list ? value : Object.values(value);
  const parts = list
    ? value.map((v) => asRows(v, inner))
    : Object.entries(value).map(([k, v]) => `${JSON.stringify(k)}: ${asRows(v, inner)}`);
  const [open, close] = list ? ["[", "]"] : ["{", "}"];
  if (!parts.length) return open + close;
  if (members.every((v) => v === null || typeof v !== "object"))
    return `${open}${parts.join(", ")}${close}`;
  return `${open}\n${parts.map((p) => inner + p).join(",\n")}\n${indent}${close}`;
}

const LARGEST = 4_000_000; // characters: longer answers are shown as Swagger UI lays them out
const laidOut = new Map(); // text -> rows, for the last few texts (a component redraws often)

/**
 * `text` in rows when it is JSON exactly as JSON.stringify(value, null, 2) lays it out (what
 * Swagger UI itself wrote); anything else (typed text, not JSON, not text) as it is.
 * @param {unknown} text
 * @returns {unknown}
 */
function inRows(text) {
  if (typeof text !== "string" || text.length > LARGEST || !/^[[{]\n/.test(text)) return text;
  if (laidOut.has(text)) return laidOut.get(text);
  let rows = text;
  try {
    const value = JSON.parse(text);
    if (JSON.stringify(value, null, 2) === text) rows = asRows(value);
  } catch {
    // not JSON: as it is
  }
  if (laidOut.size > 16) laidOut.delete(laidOut.keys().next().value);
  laidOut.set(text, rows);
  return rows;
}

/**
 * The plugin: wraps the request body editor (its value and default value) and the code boxes
 * (their text), Swagger UI's documented way of changing a component.
 * @returns {{wrapComponents: Record<string, Function>}}
 */
function JsonInRows() {
  return {
    wrapComponents: {
      RequestBodyEditor:
        (/** @type {any} */ Original, /** @type {any} */ system) => (/** @type {any} */ props) => {
          const value = inRows(props.value),
            defaultValue = inRows(props.defaultValue);
          // the editor reports its text back as the body to send: our layout of Swagger UI's own
          // text goes back as that text, so that the example picker still knows it as the example
          const back = (/** @type {unknown} */ v) =>
            v === value ? props.value : v === defaultValue ? props.defaultValue : v;
          const onChange =
            props.onChange && ((/** @type {unknown} */ v) => props.onChange(back(v)));
          return system.React.createElement(Original, {
            ...props,
            value,
            defaultValue,
            onChange,
          });
        },
      HighlightCode:
        (/** @type {any} */ Original, /** @type {any} */ system) => (/** @type {any} */ props) =>
          system.React.createElement(Original, {
            ...props,
            children: inRows(props.children),
          }),
    },
  };
}

Object.assign(window, { JsonInRows, jsonAsRows: asRows });
