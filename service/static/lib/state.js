// @ts-check
// The page's shared state, a leaf: the store (`state`), the OpenAPI document loaded once
// (`loadSpec`), the form's controls by id (`$`), a plain button, and FieldError (a form field
// that cannot be read). Imports nothing.

/**
 * A form control: nearly every id `$` is given names an input, select or textarea whose value,
 * checked or options the caller reads. The type is their union of members so that the ~170 calls
 * need no cast each; an id naming a div or a canvas is used only through HTMLElement's members.
 * @typedef {HTMLInputElement & HTMLSelectElement & HTMLTextAreaElement} Control
 */

/** @type {(id: string) => Control} */
export const $ = (id) => /** @type {Control} */ (document.getElementById(id));
// spec: the OpenAPI document; lastBody: the body last sent; lastResult: {ep, body, data};
// maskSources: for each mask object sent, the form field it came from
export const state = { spec: null, lastBody: null, lastResult: null, maskSources: [] };

export class FieldError extends Error {
  constructor(field, message) {
    super(message);
    this.field = field;
  }
}

let specLoading = null; // the fetch under way: callers at once (main.js, explain.js) share it
/** The OpenAPI document (openapi.json), fetched once and kept in `state.spec`; a failed fetch is
 * tried again by the next call. */
export async function loadSpec() {
  if (!state.spec) {
    specLoading ??= fetch("openapi.json")
      .then((r) => r.json())
      .finally(() => {
        specLoading = null;
      });
    state.spec = await specLoading;
  }
  return state.spec;
}

export function button(text, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = text;
  b.addEventListener("click", onClick);
  return b;
}
