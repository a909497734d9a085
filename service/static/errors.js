// @ts-check
// Errors next to their fields: the banner at the top and beside the results, and each error (an
// answer's, or a field the page cannot read) under the form field it names.
import { $, state } from "./lib/state.js";
import { weightName } from "./form.js";

export function clearErrors() {
  $("error").hidden = true;
  $("error").textContent = "";
  $("outcome-error").hidden = true;
  $("outcome-error").textContent = "";
  document.querySelectorAll(".field-error").forEach((el) => el.remove());
  document.querySelectorAll(".has-error").forEach((el) => el.classList.remove("has-error"));
}

export function formFieldFor(apiField) {
  if (!apiField) return null;
  const mask = /^mask\[(\d+)\]/.exec(apiField);
  let name = apiField.split(/[.[]/)[0];
  const weight = /^([qkvo])_proj[._]weight/.exec(apiField); // a state dict's, in its weight box
  if (weight && weightName(`w_${weight[1]}`) !== `w_${weight[1]}`) name = `w_${weight[1]}`;
  const gate = /^gate[.[]([wb])\b/.exec(apiField); // the gate's own boxes
  if (gate) name = `gate_${gate[1]}`;
  if (/^[qk]_norm[._]weight/.test(apiField)) name = "qk_norm_options"; // the state dict's names
  if (mask) name = state.maskSources[Number(mask[1])] || "key_lengths";
  if (name === "mask") name = state.maskSources[0] || "key_lengths";
  const el = document.querySelector(`.field[data-field="${CSS.escape(name)}"]`);
  if (el && !el.closest("[hidden]")) return el;
  return document.querySelector('.field[data-field="extra"]');
}

export function showErrors(message, errors) {
  const banner = $("error");
  banner.textContent = message;
  banner.hidden = false;
  $("outcome-error").textContent = message;
  $("outcome-error").hidden = false;
  for (const err of errors) {
    const field = formFieldFor(err.field);
    if (!field) continue;
    field.classList.add("has-error");
    const folded = field.closest("details"); // today's layers' settings, folded by default
    if (folded) folded.open = true;
    const p = document.createElement("p");
    p.className = "field-error";
    p.textContent = err.message;
    field.append(p);
  }
  const first = document.querySelector(".has-error input, .has-error textarea, .has-error select");
  if (first) first.setAttribute("aria-describedby", "error");
}
