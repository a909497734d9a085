// @ts-check
// A form field's text as numbers, a leaf: a matrix (rows of numbers, or JSON), whole numbers, a
// list of numbers, one number; a FieldError names the field that cannot be read.
import { $, FieldError } from "./state.js";

export function parseMatrix(id) {
  const text = $(id).value.trim();
  if (!text) return undefined;
  if (text.startsWith("[")) {
    try {
      return JSON.parse(text);
    } catch (e) {
      throw new FieldError(id, `${id}: not valid JSON (${e.message})`);
    }
  }
  return text
    .split(/\n|;/)
    .map((r) => r.trim())
    .filter(Boolean)
    .map((row, i) =>
      row
        .split(/[\s,]+/)
        .filter(Boolean)
        .map((tok) => {
          if (tok === "null") return null;
          if (tok === "true") return true;
          if (tok === "false") return false;
          const n = Number(tok);
          if (!Number.isFinite(n))
            throw new FieldError(id, `${id} row ${i}: "${tok}" is not a number`);
          return n;
        }),
    );
}

export function parseInts(id) {
  const text = $(id).value.trim();
  if (!text) return undefined;
  const values = text.split(/[\s,]+/).map(Number);
  if (values.some((v) => !Number.isInteger(v) || v < 0))
    throw new FieldError(id, `${id}: whole numbers ≥ 0, separated by spaces`);
  return values.length === 1 ? values[0] : values;
}

export function numbersOrUndefined(id, integers) {
  const text = $(id).value.trim();
  if (!text) return undefined;
  const values = text.split(/[\s,]+/).map(Number);
  if (values.some((v) => (integers ? !Number.isInteger(v) : !Number.isFinite(v)))) {
    throw new FieldError(
      id,
      `${id}: ${integers ? "whole numbers" : "numbers"}, separated by spaces`,
    );
  }
  return values;
}

export function numberOrUndefined(id) {
  const text = $(id).value.trim();
  if (!text) return undefined;
  const n = Number(text);
  if (!Number.isFinite(n)) throw new FieldError(id, `${id}: "${text}" is not a number`);
  return n;
}
