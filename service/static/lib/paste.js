// @ts-check
// "Compare with my numbers"' reading of a pasted array, a leaf: JSON rows, a NumPy or torch print,
// or plain rows, read into nested arrays with errors said in words (ParseError), and the numbers
// written as `expected` carries them. Imports format.js (its counted words) and layers.js (what
// a step does).
import { count } from "./format.js";
import { kindOf } from "./layers.js";

/** Whether null in `expected` is −∞ in array `name` (and NaN elsewhere; API: "Compare with your
 * numbers"): the scores of the step of kind "mask" (x-chain), and the additive mask. */
export function nullIsNegInf(name) {
  return kindOf(name) === "mask" || name === "additive_mask";
}

export class ParseError extends Error {}

export const NUMBER = /^[+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?$/i;

function token(tok, where) {
  if (NUMBER.test(tok)) return Number(tok);
  if (/^[+-]?nan$/i.test(tok)) return NaN;
  const inf = /^([+-]?)inf(?:inity)?$/i.exec(tok);
  if (inf) return inf[1] === "-" ? -Infinity : Infinity;
  if (tok === "null" || tok === "None") return null;
  if (/^true$/i.test(tok)) return true;
  if (/^false$/i.test(tok)) return false;
  const shown = tok.length > 20 ? `${tok.slice(0, 20)}…` : tok;
  throw new ParseError(`${where ? `${where}: ` : ""}“${shown}” is not a number`);
}

// The name of a node of an array of `rank` dimensions at index path `path`.
function nodeName(path, rank) {
  if (!path.length) return "the array";
  if (path.length === rank - 1) {
    const row = `row ${path[path.length - 1]}`;
    return path.length > 1 ? `${row} of block ${path.slice(0, -1).join(",")}` : row;
  }
  return `block ${path.join(",")}`;
}

// Every row as long as the first, every block as deep: the shape NumPy would give it.
export function checkShape(value) {
  if (!Array.isArray(value) || !value.length) throw new ParseError("the array is empty");
  const shape = [];
  for (let node = value; Array.isArray(node); node = node[0]) {
    if (!node.length)
      throw new ParseError(shape.length ? "an empty [] holds no numbers" : "the array is empty");
    shape.push(node.length);
  }
  const rank = shape.length;
  const walk = (node, path) => {
    const d = path.length;
    const first = path.map(() => 0);
    if (node.length !== shape[d]) {
      const unit = d === rank - 1 ? "number" : d === rank - 2 ? "row" : "block";
      throw new ParseError(
        `${nodeName(path, rank)} has ${count(node.length, unit)} but ${nodeName(first, rank)} has ${shape[d]}`,
      );
    }
    node.forEach((child, i) => {
      const deeper = d + 1 < rank;
      if (Array.isArray(child) !== deeper) {
        const here = nodeName([...path, i], rank);
        throw new ParseError(
          deeper
            ? `${here} is a single number where a list was expected (a missing [ ?)`
            : `${nodeName(path, rank)} holds a list where numbers were expected (one [ too many?)`,
        );
      }
      if (deeper) walk(child, [...path, i]);
    });
  };
  walk(value, []);
  return shape;
}

// [[...]] with or without commas (JSON, NumPy, torch), inside array(...) or tensor(...).
function parseBracketed(src, open) {
  const prefix = src.slice(0, open).trim();
  if (prefix && !/^(?:[A-Za-z_]\w*\s*=\s*)?(?:[A-Za-z_][\w.]*\s*\(\s*)?$/.test(prefix)) {
    throw new ParseError(`unexpected text before the first [: “${prefix.slice(0, 30)}”`);
  }
  const root = [];
  const stack = [root];
  let i = open;
  let end = -1;
  const where = () => {
    const path = stack.slice(1).map((_, d) => stack[d].length - 1);
    return path.length > 1
      ? `row ${path[path.length - 1]}${path.length > 2 ? ` of block ${path.slice(0, -1).join(",")}` : ""}`
      : "";
  };
  while (i < src.length) {
    const c = src[i];
    if (c === "[") {
      const child = [];
      stack[stack.length - 1].push(child);
      stack.push(child);
      i++;
    } else if (c === "]") {
      stack.pop();
      i++;
      if (stack.length === 1) {
        end = i;
        break;
      }
    } else if (c === "," || /\s/.test(c)) {
      i++;
    } else {
      const m = /^[^\s,[\]()]+/.exec(src.slice(i));
      if (!m) throw new ParseError(`unexpected “${c}” inside the brackets`);
      stack[stack.length - 1].push(token(m[0], where()));
      i += m[0].length;
    }
  }
  if (end < 0)
    throw new ParseError(`a [ is never closed (${stack.length - 1} ] missing at the end)`);
  const rest = src.slice(end).trim();
  if (rest && !/^(?:,[^[\]]*)?\)?$/.test(rest)) {
    throw new ParseError(`unexpected text after the closing ]: “${rest.slice(0, 30)}”`);
  }
  return root[0];
}

// One row per line (or per ;), numbers separated by spaces or commas.
function parseRows(src) {
  return src
    .split(/\r?\n|;/)
    .map((r) => r.trim())
    .filter(Boolean)
    .map((row, i) =>
      row
        .split(/[\s,]+/)
        .filter(Boolean)
        .map((tok) => token(tok, `row ${i}`)),
    );
}

/** Parse a pasted array: JSON rows, a NumPy or torch print, or plain rows. Returns nested
 * arrays (numbers, NaN, ±Infinity, null, booleans), or undefined for an empty text; throws
 * an Error whose message says what is wrong in words. */
export function parse(text) {
  const src = String(text ?? "").trim();
  if (!src) return undefined;
  if (/\.\.\.|…/.test(src)) {
    throw new ParseError(
      'the array was printed shortened (“...”): print it in full (np.set_printoptions(threshold=sys.maxsize), torch.set_printoptions(profile="full")) or paste .tolist()',
    );
  }
  const open = src.indexOf("[");
  const value = open < 0 ? parseRows(src) : parseBracketed(src, open);
  checkShape(value);
  return value;
}

export function shapeOf(value) {
  const s = [];
  for (let n = value; Array.isArray(n); n = n[0]) s.push(n.length);
  return s;
}

// The numbers as `expected` carries them: NaN as null, −∞ as null where null means −∞.
export function toWire(name, value) {
  const negInfIsNull = nullIsNegInf(name);
  const conv = (v) => {
    if (Array.isArray(v)) return v.map(conv);
    if (typeof v !== "number") return v;
    if (Number.isNaN(v)) return null;
    if (v === -Infinity) return negInfIsNull ? null : -Number.MAX_VALUE;
    if (v === Infinity) return Number.MAX_VALUE;
    return v;
  };
  return conv(value);
}
