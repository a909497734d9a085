// @ts-check
// The form's fields for today's layers (API.md, "Today's layers, second edition"): qk_norm with
// its eps, weights, zero-centred weights and after_rope (Llama 4); v_norm (Gemma 4); Llama 4's
// temperature; online_softmax's block size (FlashAttention's blocks, every endpoint); and on
// /multihead k_eq_v (Gemma 4) and the output gate (Qwen3-Next). Which of them
// show, filling them from a request (form.js's fillVariants), and the body's fields read from
// them (request.js's buildBody). The chunked mask sits with the other masks (form.js, request.js).
//
// The gate's weights: the page sends a gate only with weights the user gives (W_g pasted in its
// box, or a state dict's q_proj.weight holding each head's gate rows, `gate: true`); it draws no
// gate matrix of its own. A seed draws x and the projections on the service, which has no gate to
// draw, and numbers the page invented would be a second generator the request does not name.
import { $, FieldError } from "../lib/state.js";
import { formatMatrix } from "../lib/format.js";
import { parseMatrix, numberOrUndefined, numbersOrUndefined } from "../lib/fields.js";

export const LAYER_TEXT_IDS = [
  "qk_norm_eps",
  "qk_norm_q_weight",
  "qk_norm_k_weight",
  "v_norm_eps",
  "temperature_floor_scale",
  "temperature_attn_scale",
  "chunk_size",
  "gate_w",
  "gate_b",
  "online_block",
];
const CHECKS = ["qk_norm_zero_centered", "qk_norm_after_rope", "v_norm", "temperature", "k_eq_v"];

// a value typed into a setting turns its variant on (a number that would not be sent otherwise)
const TURNS_ON = {
  qk_norm_eps: "qk_norm",
  qk_norm_q_weight: "qk_norm",
  qk_norm_k_weight: "qk_norm",
  qk_norm_zero_centered: "qk_norm",
  qk_norm_after_rope: "qk_norm",
  v_norm_eps: "v_norm",
  temperature_floor_scale: "temperature",
  temperature_attn_scale: "temperature",
};

const stateDict = () =>
  $("endpoint").value === "multihead" && $("weight_names").value === "state_dict";
const keysAreValues = () => $("endpoint").value === "multihead" && $("k_eq_v").checked;

/** Every setting of today's layers back to off (a request fills them afresh). */
export function resetLayers() {
  for (const id of LAYER_TEXT_IDS) $(id).value = "";
  for (const id of CHECKS) $(id).checked = false;
  $("gate").value = "";
}

/** What shows and what may be chosen: the gate's weight boxes with the gate "given below", its
 * `q_proj.weight` choice only where the weights are a state dict's, and w_v off with k_eq_v. */
export function showLayers() {
  const gateOption = /** @type {HTMLOptionElement} */ (
    $("gate").querySelector('option[value="q_proj"]')
  );
  gateOption.disabled = !stateDict();
  if ($("gate").value === "q_proj" && !stateDict()) $("gate").value = "w";
  $("gate-weights").hidden = $("gate").value !== "w";
  if ($("gate").value === "q_proj")
    $("w_q-name").textContent +=
      " — with the gate: twice the rows, each head's query rows then its gate rows";
  for (const side of ["q", "k"])
    $(`qk_norm_${side}_weight-name`).textContent = stateDict()
      ? `${side}_norm.weight (blank: ones)`
      : `${side} weight (blank: ones)`;
  // the folded settings open when any of them is set (a request loaded, an error beside one)
  for (const id of ["layers-more", "gate-more"]) {
    const folded = /** @type {HTMLDetailsElement} */ (document.getElementById(id));
    const controls = [...folded.querySelectorAll("input, select, textarea")];
    const set = (e) => (e.type === "checkbox" ? e.checked : e.value.trim() !== "");
    if (controls.some(set)) folded.open = true;
  }
  const off = keysAreValues();
  $("w_v").disabled = off;
  $("w_v-name").textContent += off ? " — off: k_eq_v, the values are the keys' projection" : "";
}

/** The change events of these fields (main.js calls this once). */
export function startLayers(showFor) {
  for (const id of ["gate", "k_eq_v"]) $(id).addEventListener("change", showFor);
  for (const [id, on] of Object.entries(TURNS_ON)) {
    const check = CHECKS.includes(id);
    $(id).addEventListener(check ? "change" : "input", () => {
      if (check ? !$(id).checked : !$(id).value.trim()) return;
      if (on === "qk_norm") $(on).value ||= "rms";
      else $(on).checked = true;
    });
  }
}

/** Whether w_v is left out of the body: k_eq_v makes the values from the keys' projection. */
export function withoutValues() {
  return keysAreValues();
}

// ---- the body

/** The fields of today's layers read into `body` (only what is set: a variant at its defaults
 * alone sends `true`). */
export function layersBody(body, ep) {
  const type = $("qk_norm").value;
  if (type) {
    const o = {};
    if (type !== "rms") o.type = type;
    const eps = numberOrUndefined("qk_norm_eps");
    if (eps !== undefined) o.eps = eps;
    // the weights as the other weights are named: a state dict's q_norm.weight, or qk_norm's own
    for (const side of ["q", "k"]) {
      const w = numbersOrUndefined(`qk_norm_${side}_weight`, false);
      if (w !== undefined && stateDict()) body[`${side}_norm.weight`] = w;
      else if (w !== undefined) o[`${side}_weight`] = w;
    }
    if ($("qk_norm_zero_centered").checked) o.zero_centered = true;
    if ($("qk_norm_after_rope").checked) o.after_rope = true;
    body.qk_norm = Object.keys(o).length ? o : true;
  }
  if ($("v_norm").checked) {
    const eps = numberOrUndefined("v_norm_eps");
    body.v_norm = eps === undefined ? true : { type: "rms", eps };
  }
  if ($("temperature").checked) {
    const t = {};
    const floor = numberOrUndefined("temperature_floor_scale");
    if (floor !== undefined) t.floor_scale = floor;
    const slope = numberOrUndefined("temperature_attn_scale");
    if (slope !== undefined) t.attn_scale = slope;
    body.temperature = t;
  }
  const block = numberOrUndefined("online_block");
  if (block !== undefined) body.online_softmax = { block_size: block };
  if (ep !== "multihead") return;
  if ($("k_eq_v").checked) body.k_eq_v = true;
  const gate = $("gate").value;
  if (gate === "q_proj") body.gate = true;
  if (gate === "w") {
    const w = parseMatrix("gate_w");
    if (w === undefined)
      throw new FieldError(
        "gate_w",
        "gate: W_g [h·d_v × d_model] (out_in) is empty. The gate needs its own weights: paste " +
          "them here (a seed draws x and the projections, not the gate), or turn the gate off.",
      );
    const b = numbersOrUndefined("gate_b", false);
    body.gate = b === undefined ? { w } : { w, b };
  }
}

// ---- filling from a request

const isNumbers = (v) => Array.isArray(v) && v.every((n) => typeof n === "number");
const isMatrix = (v) => Array.isArray(v) && v.length > 0 && v.every(isNumbers);
/** v is true, or an object whose keys are among `keys` and whose values pass `ok[key]`. */
function only(v, ok) {
  if (v === true) return true;
  if (!v || typeof v !== "object" || Array.isArray(v)) return false;
  return Object.entries(v).every(([k, x]) => k in ok && ok[k](x));
}
const num = (x) => typeof x === "number";
const bool = (x) => typeof x === "boolean";

/** The settings of today's layers move from `ex` into the form; what the form cannot hold stays
 * in `ex` (the "more fields" box). */
export function fillLayers(ex) {
  const qk = ex.qk_norm;
  const qkKeys = {
    type: (x) => x === "rms" || x === "layer",
    eps: num,
    q_weight: isNumbers,
    k_weight: isNumbers,
    zero_centered: bool,
    after_rope: bool,
  };
  if (qk === false) delete ex.qk_norm;
  else if (only(qk, qkKeys)) {
    const o = qk === true ? {} : qk;
    $("qk_norm").value = o.type || "rms";
    if (o.eps !== undefined) $("qk_norm_eps").value = String(o.eps);
    if (o.q_weight) $("qk_norm_q_weight").value = o.q_weight.join(" ");
    if (o.k_weight) $("qk_norm_k_weight").value = o.k_weight.join(" ");
    $("qk_norm_zero_centered").checked = !!o.zero_centered;
    $("qk_norm_after_rope").checked = !!o.after_rope;
    delete ex.qk_norm;
    // /multihead's state-dict names for the same weights (they win over qk_norm's own)
    for (const side of ["q", "k"])
      for (const key of [`${side}_norm.weight`, `${side}_norm_weight`])
        if (isNumbers(ex[key])) {
          $(`qk_norm_${side}_weight`).value = ex[key].join(" ");
          delete ex[key];
        }
  }
  if (ex.v_norm === false) delete ex.v_norm;
  else if (only(ex.v_norm, { type: (x) => x === "rms", eps: num })) {
    $("v_norm").checked = true;
    if (ex.v_norm !== true && ex.v_norm.eps !== undefined) $("v_norm_eps").value = ex.v_norm.eps;
    delete ex.v_norm;
  }
  const t = ex.temperature;
  if (t === null) delete ex.temperature;
  else if (t !== true && only(t, { floor_scale: num, attn_scale: num })) {
    $("temperature").checked = true;
    if (t.floor_scale !== undefined) $("temperature_floor_scale").value = t.floor_scale;
    if (t.attn_scale !== undefined) $("temperature_attn_scale").value = t.attn_scale;
    delete ex.temperature;
  }
  const online = ex.online_softmax;
  if (online === null) delete ex.online_softmax;
  else if (online !== true && only(online, { block_size: num })) {
    $("online_block").value = String(online.block_size ?? 4); // the service's default
    delete ex.online_softmax;
  }
  if (typeof ex.k_eq_v === "boolean") {
    $("k_eq_v").checked = ex.k_eq_v;
    delete ex.k_eq_v;
  }
  const gate = ex.gate;
  if (gate === false) delete ex.gate;
  else if (gate === true && $("weight_names").value === "state_dict") {
    $("gate").value = "q_proj";
    delete ex.gate;
  } else if (gate !== true && only(gate, { w: isMatrix, b: isNumbers }) && gate.w) {
    $("gate").value = "w";
    $("gate_w").value = formatMatrix(gate.w);
    if (gate.b) $("gate_b").value = gate.b.join(" ");
    delete ex.gate;
  }
}
