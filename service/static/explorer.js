// The attention explorer: builds a request from the form, calls this service's JSON API, and
// draws what comes back. No libraries, no build step, no request outside the service.
"use strict";

const $ = (id) => document.getElementById(id);
const SMALL_MAP = 24 * 24; // up to this many cells: SVG with the value in every cell
const TABLE_ROWS = 64;
let spec = null;
let lastBody = null;
let lastResult = null;
let maskSources = []; // for each mask object sent, the form field it came from

// ---- text <-> matrices ------------------------------------------------------------------

class FieldError extends Error {
  constructor(field, message) { super(message); this.field = field; }
}

function parseMatrix(id) {
  const text = $(id).value.trim();
  if (!text) return undefined;
  if (text.startsWith("[")) {
    try { return JSON.parse(text); } catch (e) { throw new FieldError(id, `${id}: not valid JSON (${e.message})`); }
  }
  return text.split(/\n|;/).map((r) => r.trim()).filter(Boolean).map((row, i) =>
    row.split(/[\s,]+/).filter(Boolean).map((tok) => {
      if (tok === "null") return null;
      if (tok === "true") return true;
      if (tok === "false") return false;
      const n = Number(tok);
      if (!Number.isFinite(n)) throw new FieldError(id, `${id} row ${i}: "${tok}" is not a number`);
      return n;
    }));
}

function formatMatrix(m) {
  if (!Array.isArray(m)) return "";
  const flat = m.every((row) => Array.isArray(row) && row.every((v) => !Array.isArray(v)));
  return flat ? m.map((row) => row.map((v) => (v === null ? "null" : String(v))).join(" ")).join("\n") : JSON.stringify(m);
}

function parseInts(id) {
  const text = $(id).value.trim();
  if (!text) return undefined;
  const values = text.split(/[\s,]+/).map(Number);
  if (values.some((v) => !Number.isInteger(v) || v < 0)) throw new FieldError(id, `${id}: whole numbers ≥ 0, separated by spaces`);
  return values.length === 1 ? values[0] : values;
}

function numbersOrUndefined(id, integers) {
  const text = $(id).value.trim();
  if (!text) return undefined;
  const values = text.split(/[\s,]+/).map(Number);
  if (values.some((v) => (integers ? !Number.isInteger(v) : !Number.isFinite(v)))) {
    throw new FieldError(id, `${id}: ${integers ? "whole numbers" : "numbers"}, separated by spaces`);
  }
  return values;
}

function numberOrUndefined(id) {
  const text = $(id).value.trim();
  if (!text) return undefined;
  const n = Number(text);
  if (!Number.isFinite(n)) throw new FieldError(id, `${id}: "${text}" is not a number`);
  return n;
}

// ---- the form -----------------------------------------------------------------------------

const TEXT_IDS = ["tokens", "sentence", "seed", "d_model", "d_k", "x", "w_q", "w_k", "w_v", "q", "k", "v", "context",
  "scale", "key_lengths", "query_lengths", "window_left", "window_right", "boolean", "additive", "num_kv_heads",
  "positional_matrix", "w_o", "softcap", "rope_base", "rope_rotary_dim", "sinks", "positions", "extra"];

function showFor() {
  const ep = $("endpoint").value;
  const mode = $("mode").value;
  $("mode").querySelector('option[value="direct"]').disabled = ep === "multihead";
  if (ep === "multihead" && mode === "direct") $("mode").value = "projections";
  const current = $("mode").value;
  document.querySelectorAll(".mode-projections, .mode-direct, .mode-generated").forEach((el) => {
    el.hidden = !el.classList.contains(`mode-${current}`);
  });
  $("multihead-set").hidden = ep !== "multihead";
  $("sinks-label").textContent = ep === "multihead" ? "sinks (blank: off; one number per head)" : "sinks (blank: off; one number)";
  $("mask-set").querySelector("legend").textContent =
    ep === "mask" ? "Mask (required; combined with AND; true = may attend)" : "Mask (optional; combined with AND; true = may attend)";
}

function buildBody() {
  const ep = $("endpoint").value;
  const mode = $("mode").value;
  const body = {};
  const tokens = $("tokens").value.trim();
  if (tokens) body.tokens = tokens.split(/\s+/);
  if (mode === "generated") {
    const sentence = $("sentence").value.trim();
    if (sentence) { body.sentence = sentence; delete body.tokens; }
    for (const id of ["seed", "d_model", "d_k"]) { const n = numberOrUndefined(id); if (n !== undefined) body[id] = n; }
    if ($("init").value !== "uniform") body.init = $("init").value;
  }
  const matrices = mode === "direct" ? ["q", "k", "v"] : mode === "projections" ? ["x", "w_q", "w_k", "w_v", "context"] : ["x", "w_q", "w_k", "w_v"];
  for (const id of matrices) { const m = parseMatrix(id); if (m !== undefined) body[id] = m; }
  if ($("weight_layout").value !== "in_out") body.weight_layout = $("weight_layout").value;
  const scale = numberOrUndefined("scale");
  if (scale !== undefined) body.scale = scale;
  if ($("fully_masked_rows").value !== "zero") body.fully_masked_rows = $("fully_masked_rows").value;

  const masks = [];
  maskSources = [];
  const add = (m, source) => { masks.push(m); maskSources.push(source); };
  if ($("causal").checked) add({ type: "causal", alignment: $("alignment").value }, "alignment");
  const keyLengths = parseInts("key_lengths");
  const queryLengths = parseInts("query_lengths");
  if (keyLengths !== undefined || queryLengths !== undefined) {
    const m = { type: "padding" };
    if (keyLengths !== undefined) m.key_lengths = keyLengths;
    if (queryLengths !== undefined) m.query_lengths = queryLengths;
    add(m, keyLengths !== undefined ? "key_lengths" : "query_lengths");
  }
  const left = numberOrUndefined("window_left");
  const right = numberOrUndefined("window_right");
  if (left !== undefined || right !== undefined) add({ type: "window", left: left ?? null, right: right ?? null }, "window_left");
  const boolean = parseMatrix("boolean");
  if (boolean !== undefined) add({ type: "boolean", matrix: boolean }, "boolean");
  const additive = parseMatrix("additive");
  if (additive !== undefined) add({ type: "additive", matrix: additive }, "additive");
  if (masks.length) body.mask = masks.length === 1 ? masks[0] : masks;

  // position and score variants (API 2.6): only what is set; defaults alone send `true`
  if ($("qk_norm").value) body.qk_norm = $("qk_norm").value === "rms" ? true : { type: $("qk_norm").value };
  if ($("rope").checked) {
    const rope = {};
    const base = numberOrUndefined("rope_base");
    if (base !== undefined) rope.base = base;
    if ($("rope_style").value !== "half") rope.style = $("rope_style").value;
    const dim = numberOrUndefined("rope_rotary_dim");
    if (dim !== undefined) rope.rotary_dim = dim;
    body.rope = Object.keys(rope).length ? rope : true;
  }
  const softcap = numberOrUndefined("softcap");
  if (softcap !== undefined) body.softcap = softcap;
  if ($("alibi").checked) body.alibi = $("alibi_symmetric").checked ? { symmetric: true } : true;
  const sinks = numbersOrUndefined("sinks", false);
  if (sinks !== undefined) {
    if (ep === "multihead") body.sinks = sinks;
    else if (sinks.length === 1) body.sinks = sinks[0];
    else throw new FieldError("sinks", "sinks: one number on this endpoint (one per head on /multihead)");
  }
  const positions = numbersOrUndefined("positions", true);
  if (positions !== undefined) body.positions = positions;

  if (ep === "multihead") {
    body.num_heads = numberOrUndefined("num_heads") ?? 1;
    const kv = numberOrUndefined("num_kv_heads");
    if (kv !== undefined) body.num_kv_heads = kv;
    const pe = $("positional_kind").value;
    if (pe === "sinusoidal") body.positional_encoding = "sinusoidal";
    if (pe === "matrix") body.positional_encoding = parseMatrix("positional_matrix");
    if ($("residual").checked) body.residual = true;
    if ($("layer_norm").checked) body.layer_norm = $("ln_over").value === "features" ? true : { over: $("ln_over").value };
    const wo = parseMatrix("w_o");
    if (wo !== undefined) body.w_o = wo;
  }
  const extra = $("extra").value.trim();
  if (extra) {
    let more;
    try { more = JSON.parse(extra); } catch (e) { throw new FieldError("extra", `more fields: not valid JSON (${e.message})`); }
    if (typeof more !== "object" || Array.isArray(more) || more === null) throw new FieldError("extra", "more fields: a JSON object, e.g. {\"b_q\": [0, 1]}");
    Object.assign(body, more);
  }
  return body;
}

function fillForm(example) {
  const ex = { ...example };
  delete ex.include; // the explorer shows every step
  for (const id of TEXT_IDS) $(id).value = "";
  for (const id of ["causal", "residual", "layer_norm", "rope", "alibi", "alibi_symmetric"]) $(id).checked = false;
  $("qk_norm").value = ""; $("rope_style").value = "half";
  $("weight_layout").value = "in_out"; $("fully_masked_rows").value = "zero"; $("init").value = "uniform";
  $("alignment").value = "upper_left"; $("positional_kind").value = ""; $("ln_over").value = "features"; $("num_heads").value = "2";

  const generated = ex.seed !== undefined && ["x", "w_q", "w_k", "w_v"].some((n) => ex[n] === undefined);
  $("mode").value = ex.q !== undefined ? "direct" : generated ? "generated" : "projections";
  const take = (name) => { const v = ex[name]; delete ex[name]; return v; };
  const tokens = take("tokens");
  if (tokens) $("tokens").value = tokens.join(" ");
  for (const id of ["sentence", "seed", "d_model", "d_k"]) { const v = take(id); if (v !== undefined) $(id).value = v; }
  const init = take("init"); if (init) $("init").value = init;
  for (const id of ["x", "w_q", "w_k", "w_v", "q", "k", "v", "context", "w_o"]) { const v = take(id); if (v !== undefined) $(id).value = formatMatrix(v); }
  for (const id of ["weight_layout", "fully_masked_rows"]) { const v = take(id); if (v !== undefined) $(id).value = v; }
  const scale = take("scale"); if (scale !== undefined && scale !== null) $("scale").value = scale;
  const mask = take("mask");
  const leftover = [];
  for (const m of mask === undefined ? [] : Array.isArray(mask) ? mask : [mask]) {
    if (m.type === "causal" && !$("causal").checked) { $("causal").checked = true; $("alignment").value = m.alignment || "upper_left"; }
    else if (m.type === "padding" && !$("key_lengths").value && !$("query_lengths").value) {
      if (m.key_lengths !== undefined) $("key_lengths").value = [].concat(m.key_lengths).join(" ");
      if (m.query_lengths !== undefined) $("query_lengths").value = [].concat(m.query_lengths).join(" ");
    } else if (m.type === "window" && !$("window_left").value && !$("window_right").value) {
      if (m.left !== undefined && m.left !== null) $("window_left").value = m.left;
      if (m.right !== undefined && m.right !== null) $("window_right").value = m.right;
    } else if (m.type === "boolean" && !$("boolean").value) $("boolean").value = formatMatrix(m.matrix);
    else if (m.type === "additive" && !$("additive").value) $("additive").value = formatMatrix(m.matrix);
    else leftover.push(m);
  }
  if (leftover.length) ex.mask = leftover; // kinds repeated beyond what the form holds
  fillVariants(ex);
  const heads = take("num_heads"); if (heads !== undefined) $("num_heads").value = heads;
  const kv = take("num_kv_heads"); if (kv !== undefined) $("num_kv_heads").value = kv;
  const pe = take("positional_encoding");
  if (pe === "sinusoidal") $("positional_kind").value = "sinusoidal";
  else if (pe !== undefined) { $("positional_kind").value = "matrix"; $("positional_matrix").value = formatMatrix(pe); }
  if (take("residual")) $("residual").checked = true;
  const ln = take("layer_norm");
  if (ln) { $("layer_norm").checked = true; if (typeof ln === "object" && ln.over) $("ln_over").value = ln.over; if (typeof ln === "object" && Object.keys(ln).some((key) => key !== "over")) { const { over, ...rest } = ln; ex.layer_norm = { over: over || "features", ...rest }; $("layer_norm").checked = false; } }
  if (Object.keys(ex).length) $("extra").value = JSON.stringify(ex);
  showFor();
}

// The variants the form holds move from `ex` into the form; other settings stay in `ex` (more fields).
function fillVariants(ex) {
  const only = (v, keys) => v === true || (v && typeof v === "object" && !Array.isArray(v) && Object.keys(v).every((k) => keys.includes(k)));
  const qk = ex.qk_norm;
  if (only(qk, ["type"])) { $("qk_norm").value = qk === true ? "rms" : qk.type || "rms"; delete ex.qk_norm; }
  const rope = ex.rope;
  if (only(rope, ["base", "style", "rotary_dim"])) {
    $("rope").checked = true;
    if (rope !== true) {
      if (rope.base !== undefined) $("rope_base").value = rope.base;
      if (rope.style) $("rope_style").value = rope.style;
      if (rope.rotary_dim !== undefined) $("rope_rotary_dim").value = rope.rotary_dim;
    }
    delete ex.rope;
  }
  const alibi = ex.alibi;
  if (only(alibi, ["symmetric"])) { $("alibi").checked = true; $("alibi_symmetric").checked = alibi !== true && !!alibi.symmetric; delete ex.alibi; }
  if (typeof ex.softcap === "number") { $("softcap").value = ex.softcap; delete ex.softcap; }
  if (typeof ex.sinks === "number" || (Array.isArray(ex.sinks) && ex.sinks.every((n) => typeof n === "number"))) {
    $("sinks").value = [].concat(ex.sinks).join(" "); delete ex.sinks;
  }
  if (Array.isArray(ex.positions) && ex.positions.every(Number.isInteger)) { $("positions").value = ex.positions.join(" "); delete ex.positions; }
}

async function loadSpec() {
  if (!spec) spec = await (await fetch("openapi.json")).json();
  return spec;
}

async function loadExamples() {
  const ep = $("endpoint").value;
  await loadSpec();
  const examples = spec.paths[`/${ep}`].post.requestBody.content["application/json"].examples || {};
  const select = $("example");
  select.replaceChildren(new Option("— choose —", ""));
  for (const [key, ex] of Object.entries(examples)) select.add(new Option(ex.summary || key, key));
  return examples;
}

// ---- errors next to their fields ----------------------------------------------------------

function clearErrors() {
  $("error").hidden = true; $("error").textContent = "";
  document.querySelectorAll(".field-error").forEach((el) => el.remove());
  document.querySelectorAll(".has-error").forEach((el) => el.classList.remove("has-error"));
}

function formFieldFor(apiField) {
  if (!apiField) return null;
  const mask = /^mask\[(\d+)\]/.exec(apiField);
  let name = apiField.split(/[.[]/)[0];
  if (mask) name = maskSources[Number(mask[1])] || "key_lengths";
  if (name === "mask") name = maskSources[0] || "key_lengths";
  const el = document.querySelector(`.field[data-field="${CSS.escape(name)}"]`);
  if (el && !el.closest("[hidden]")) return el;
  return document.querySelector('.field[data-field="extra"]');
}

function showErrors(message, errors) {
  const banner = $("error");
  banner.textContent = message; banner.hidden = false;
  for (const err of errors) {
    const field = formFieldFor(err.field);
    if (!field) continue;
    field.classList.add("has-error");
    const p = document.createElement("p");
    p.className = "field-error"; p.textContent = err.message;
    field.append(p);
  }
  const first = document.querySelector(".has-error input, .has-error textarea, .has-error select");
  if (first) first.setAttribute("aria-describedby", "error");
}

// ---- running ------------------------------------------------------------------------------

async function run(event) {
  if (event) event.preventDefault();
  clearErrors();
  let body;
  try { body = buildBody(); } catch (e) {
    if (e instanceof FieldError) { showErrors(e.message, [{ field: e.field, message: e.message }]); return; }
    throw e;
  }
  lastBody = body;
  const ep = $("endpoint").value;
  $("status").textContent = "Computing…";
  const started = performance.now();
  let response;
  try {
    response = await fetch(ep, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  } catch (e) { $("status").textContent = ""; showErrors(`The service did not answer: ${e.message}`, []); return; }
  const data = await response.json();
  if (!response.ok) {
    $("status").textContent = `Error ${response.status}`;
    showErrors(data.message || `HTTP ${response.status}`, data.errors || []);
    return;
  }
  try { await loadSpec(); } catch (e) { $("status").textContent = ""; showErrors(`Could not read openapi.json: ${e.message}`, []); return; }
  lastResult = { ep, body, data };
  const ms = performance.now() - started;
  setupBatch(ep, data);
  render();
  $("status").textContent = `Done in ${Math.round(ms)} ms`;
  const top = $("results").getBoundingClientRect().top;
  if (top < 0 || top > window.innerHeight) $("results").scrollIntoView({ block: "start" });
}

// ---- what to draw: the x-view entries of the response schema ---------------------------------

// The service describes each drawable output in its OpenAPI document: the property of the
// endpoint's response schema carries `x-view` {title, map, rows, each_head}, and property order is
// drawing order. `map` names a heatmap's colours (scores, weights, mask); without one the output is
// a table whose rows are the query tokens, the key tokens or plain indices. A property holding a
// list of objects whose own properties carry x-view (the per-head traces of /multihead) is drawn
// once per item, for the entries marked each_head. No output name is listed for drawing (only
// SCALED_BY_SCALE below, which adds the scale to one title).

function resolveRef(ref) { return ref.replace(/^#\//, "").split("/").reduce((o, k) => (o ? o[k] : undefined), spec); }

function viewsOf(schema) {
  const views = [];
  for (const [name, prop] of Object.entries((schema && schema.properties) || {})) {
    const view = prop["x-view"];
    if (view) { views.push({ ...view, name, map: view.map || null }); continue; }
    for (const alt of prop.anyOf || prop.oneOf || [prop]) { // a nullable property is anyOf [..., null]
      const item = alt.type === "array" && alt.items && alt.items.$ref ? resolveRef(alt.items.$ref) : null;
      const each = viewsOf(item).filter((v) => v.each_head && !v.each);
      if (each.length) { views.push({ name, each }); break; }
    }
  }
  return views;
}

const viewCache = new Map();
function responseViews(ep) {
  if (!viewCache.has(ep)) {
    const schema = spec.paths[`/${ep}`].post.responses["200"].content["application/json"].schema;
    viewCache.set(ep, viewsOf(schema.$ref ? resolveRef(schema.$ref) : schema));
  }
  return viewCache.get(ep);
}

const isMatrix = (m) => Array.isArray(m) && Array.isArray(m[0]) && !Array.isArray(m[0][0]);
const isStack = (m) => Array.isArray(m) && Array.isArray(m[0]) && Array.isArray(m[0][0]);

// The first heatmap in the answer (top level first, then the first item of a per-head list), as
// returned: [L][S], or [B][L][S] when the request was batched.
function firstMap(ep, data) {
  const views = responseViews(ep);
  for (const v of views) if (v.map && data[v.name]) return data[v.name];
  for (const v of views) if (v.each && Array.isArray(data[v.name]) && data[v.name][0]) {
    for (const e of v.each) if (e.map && data[v.name][0][e.name]) return data[v.name][0][e.name];
  }
  return null;
}

function isBatched(ep, data) { return isStack(firstMap(ep, data)); }

function setupBatch(ep, data) {
  const pick = $("batch");
  pick.replaceChildren();
  const batched = isBatched(ep, data);
  $("batch-pick").hidden = !batched;
  if (batched) {
    const n = firstMap(ep, data).length;
    for (let b = 0; b < n; b++) pick.add(new Option(String(b), String(b)));
  }
}

// ---- drawing ------------------------------------------------------------------------------

function escapeXml(s) { return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c])); }

function colour(v, kind, scale) {
  if (v === null) return null;
  if (kind === "mask") return v ? "#2458a6" : "#ffffff";
  if (kind === "weights") { const t = Math.max(0, Math.min(1, v / (scale || 1))); return mix([255, 255, 255], [36, 88, 166], t); } // relative to the map's largest weight
  const t = scale ? Math.max(-1, Math.min(1, v / scale)) : 0; // diverging: red below 0, blue above
  return t < 0 ? mix([255, 255, 255], [179, 38, 30], -t) : mix([255, 255, 255], [36, 88, 166], t);
}
function mix(a, b, t) { return `rgb(${a.map((x, i) => Math.round(x + (b[i] - x) * t)).join(",")})`; }
function dark(v, kind, scale) { if (v === null) return false; const t = kind === "mask" ? (v ? 1 : 0) : Math.abs(v / (scale || 1)); return t > 0.55; }
function fmt(v) { return v === null ? "−∞" : typeof v === "boolean" ? (v ? "1" : "0") : Math.abs(v) >= 1000 || (v !== 0 && Math.abs(v) < 0.001) ? v.toExponential(2) : v.toFixed(3).replace(/\.?0+$/, "") || "0"; }
function maxAbs(m) { let s = 0; for (const row of m) for (const v of row) if (typeof v === "number") s = Math.max(s, Math.abs(v)); return s; }

// `allowed` (optional, the response's mask) hatches masked cells whose value is a plain 0 (weights).
const isMasked = (m, allowed, i, j) => m[i][j] === null || (allowed && allowed[i] && allowed[i][j] === false);

function svgString(title, m, rows, cols, kind, withValues, allowed) {
  const cell = withValues ? 44 : Math.max(3, Math.min(14, Math.floor(900 / Math.max(1, cols.length))));
  const labelW = withValues ? 70 : 0;
  const top = withValues ? 44 : 24;
  const w = labelW + cell * cols.length + 10;
  const h = top + cell * rows.length + 10;
  const scale = maxAbs(m);
  const parts = [`<svg xmlns="http://www.w3.org/2000/svg" width="${w}" height="${h}" viewBox="0 0 ${w} ${h}" font-family="system-ui, sans-serif" font-size="11" role="img" aria-label="${escapeXml(title)}">`,
    '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#c9ced6"/><line x1="0" y1="0" x2="0" y2="6" stroke="#7d8794" stroke-width="2"/></pattern></defs>',
    `<rect width="${w}" height="${h}" fill="#fff"/><text x="4" y="14" font-weight="600">${escapeXml(title)}</text>`];
  if (withValues) {
    cols.forEach((c, j) => parts.push(`<text class="col-label" x="${labelW + j * cell + cell / 2}" y="${top - 6}" text-anchor="middle">${escapeXml(c)}</text>`));
    rows.forEach((r, i) => parts.push(`<text class="row-label" x="${labelW - 6}" y="${top + i * cell + cell / 2 + 4}" text-anchor="end">${escapeXml(r)}</text>`));
  }
  m.forEach((row, i) => row.forEach((v, j) => {
    const masked = isMasked(m, allowed, i, j);
    const fill = masked ? "url(#hatch)" : colour(v, kind, scale);
    const value = v === null ? "null" : String(v);
    parts.push(`<rect class="cell${masked ? " masked" : ""}" data-row="${i}" data-col="${j}" data-value="${value}" x="${labelW + j * cell}" y="${top + i * cell}" width="${cell}" height="${cell}" fill="${fill}" stroke="#fff" stroke-width="${withValues ? 1 : 0}"><title>${escapeXml(rows[i])} → ${escapeXml(cols[j])}: ${escapeXml(fmt(v))}${masked ? " (masked)" : ""}</title></rect>`);
    if (withValues) parts.push(`<text x="${labelW + j * cell + cell / 2}" y="${top + i * cell + cell / 2 + 4}" text-anchor="middle" pointer-events="none" fill="${!masked && dark(v, kind, scale) ? "#fff" : "#1d232b"}">${escapeXml(fmt(v))}</text>`);
  }));
  parts.push("</svg>");
  return parts.join("");
}

function drawCanvas(canvas, m, kind, cell, cursor, allowed) {
  const ctx = canvas.getContext("2d");
  const scale = maxAbs(m);
  canvas.width = m[0].length * cell; canvas.height = m.length * cell;
  for (let i = 0; i < m.length; i++) for (let j = 0; j < m[i].length; j++) {
    const v = m[i][j];
    const masked = isMasked(m, allowed, i, j);
    ctx.fillStyle = masked ? "#c9ced6" : colour(v, kind, scale);
    ctx.fillRect(j * cell, i * cell, cell, cell);
    if (masked && cell >= 4) { ctx.strokeStyle = "#7d8794"; ctx.beginPath(); ctx.moveTo(j * cell, (i + 1) * cell); ctx.lineTo((j + 1) * cell, i * cell); ctx.stroke(); }
  }
  if (cursor) { ctx.strokeStyle = "#f2b705"; ctx.lineWidth = 2; ctx.strokeRect(cursor[1] * cell, cursor[0] * cell, cell, cell); }
}

function download(name, blob) {
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob); a.download = name;
  document.body.append(a); a.click(); a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

function exportPng(name, m, rows, cols, kind, allowed) {
  const cell = Math.max(4, Math.min(40, Math.floor(1600 / Math.max(cols.length, rows.length))));
  const canvas = document.createElement("canvas");
  drawCanvas(canvas, m, kind, cell, null, allowed);
  canvas.toBlob((blob) => download(`${name}.png`, blob), "image/png");
}

function heatmap(key, title, m, rows, cols, kind, allowed) {
  const fig = document.createElement("figure");
  fig.className = "heatmap"; fig.dataset.name = key;
  const caption = document.createElement("figcaption");
  caption.append(title);
  const svgButton = button("SVG", () => download(`${key}.svg`, new Blob([svgString(title, m, rows, cols, kind, rows.length * cols.length <= SMALL_MAP, allowed)], { type: "image/svg+xml" })));
  const pngButton = button("PNG", () => exportPng(key, m, rows, cols, kind, allowed));
  svgButton.setAttribute("aria-label", `Download ${title} as SVG`); pngButton.setAttribute("aria-label", `Download ${title} as PNG`);
  caption.append(svgButton, pngButton);
  fig.append(caption);
  const scroll = document.createElement("div"); scroll.className = "map-scroll";
  const readout = document.createElement("div"); readout.className = "cell-readout"; readout.setAttribute("aria-live", "polite");
  const say = (i, j) => { readout.textContent = `${rows[i]} → ${cols[j]}: ${fmt(m[i][j])}${isMasked(m, allowed, i, j) ? " (masked)" : ""}`; };
  if (rows.length * cols.length <= SMALL_MAP) {
    scroll.innerHTML = svgString(title, m, rows, cols, kind, true, allowed);
    scroll.addEventListener("mouseover", (e) => { const c = e.target.closest("rect.cell"); if (c) say(+c.dataset.row, +c.dataset.col); });
  } else {
    const canvas = document.createElement("canvas");
    const cell = Math.max(2, Math.min(12, Math.floor(900 / cols.length)));
    canvas.tabIndex = 0; canvas.dataset.rows = rows.length; canvas.dataset.cols = cols.length;
    canvas.setAttribute("role", "img"); canvas.setAttribute("aria-label", `${title}: ${rows.length} × ${cols.length}; arrow keys read cells`);
    let cursor = [0, 0];
    drawCanvas(canvas, m, kind, cell, null, allowed);
    canvas.addEventListener("mousemove", (e) => {
      const r = canvas.getBoundingClientRect();
      const i = Math.floor((e.clientY - r.top) / cell), j = Math.floor((e.clientX - r.left) / cell);
      if (i >= 0 && j >= 0 && i < rows.length && j < cols.length) say(i, j);
    });
    canvas.addEventListener("keydown", (e) => {
      const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
      if (!moves[e.key]) return;
      e.preventDefault();
      cursor = [Math.max(0, Math.min(rows.length - 1, cursor[0] + moves[e.key][0])), Math.max(0, Math.min(cols.length - 1, cursor[1] + moves[e.key][1]))];
      drawCanvas(canvas, m, kind, cell, cursor, allowed); say(cursor[0], cursor[1]);
    });
    canvas.addEventListener("focus", () => say(cursor[0], cursor[1]));
    scroll.append(canvas);
  }
  fig.append(scroll, readout);
  return fig;
}

function button(text, onClick) { const b = document.createElement("button"); b.type = "button"; b.textContent = text; b.addEventListener("click", onClick); return b; }

function table(key, title, m, rows) {
  const wrap = document.createElement("div"); wrap.className = "table-scroll";
  const t = document.createElement("table"); t.className = "matrix"; t.dataset.name = key;
  t.createCaption().textContent = `${title} [${m.length} × ${m[0].length}]${m.length > TABLE_ROWS ? ` — first ${TABLE_ROWS} rows` : ""}`;
  const head = t.createTHead().insertRow(); head.append(document.createElement("th"));
  m[0].forEach((_, j) => { const th = document.createElement("th"); th.textContent = String(j); head.append(th); });
  const tbody = t.createTBody();
  m.slice(0, TABLE_ROWS).forEach((row, i) => {
    const tr = tbody.insertRow();
    const th = document.createElement("th"); th.textContent = rows[i] ?? String(i); tr.append(th);
    row.forEach((v) => { const td = tr.insertCell(); td.textContent = fmt(v); td.title = String(v); });
  });
  wrap.append(t);
  return wrap;
}

// The map whose values are Q Kᵀ times `scale`: its title at the top level shows the factor.
const SCALED_BY_SCALE = "scaled_scores";
// A vector without x-view: the weight each query row gives the sink, drawn as a one-column table.
const SINK_WEIGHTS = "sink_weights";
function sinkColumn(obj) {
  const v = obj && obj[SINK_WEIGHTS];
  if (!Array.isArray(v) || !v.length) return null;
  const b = Number($("batch").value || 0);
  const row = Array.isArray(v[0]) ? v[b] : v; // [L], or [B][L] when batched
  return Array.isArray(row) && row.every((x) => typeof x === "number") ? row.map((x) => [x]) : null;
}

function render() {
  if (!lastResult) return;
  const { ep, data } = lastResult;
  const views = responseViews(ep);
  const b = Number($("batch").value || 0);
  const batched = isBatched(ep, data);
  const pick = (v) => (v === undefined || v === null ? v : batched ? v[b] : v);
  // a drawn value is [·][·], or [B][·][·] when batched (generated arrays never gain the B)
  const matrix = (v) => (isStack(v) ? v[b] : isMatrix(v) ? v : undefined);
  const first = matrix(firstMap(ep, data));
  const n = first ? first.length : 0;
  const rows = data.tokens || Array.from({ length: n }, (_, i) => String(i));
  const S = first && first.length ? first[0].length : 0;
  const cols = data.context_tokens || (S === rows.length ? rows : Array.from({ length: S }, (_, i) => String(i)));
  $("results").hidden = false;

  const summary = pick(data.summary) || [];
  $("summary").replaceChildren(...summary.map((r, i) => {
    const li = document.createElement("li");
    const who = r.token ?? `query ${i}`;
    li.textContent = r.top_key_index === null
      ? `${who} attends to no key (every key is masked)`
      : `${who} attends most to ${r.top_key ?? `key ${r.top_key_index}`}, ${fmt(r.top_weight)} (entropy ${fmt(r.entropy_bits)} bits)`;
    return li;
  }));

  // what to draw, in schema order: {key, title, view, m}; a per-head list expands in place
  const items = [];
  for (const view of views) {
    if (!view.each) {
      const title = view.name === SCALED_BY_SCALE && data.scale !== undefined ? `${view.title}  · ${fmt(data.scale)}` : view.title;
      items.push({ key: view.name, label: view.name, title, view, m: matrix(data[view.name]) });
      continue;
    }
    (Array.isArray(data[view.name]) ? data[view.name] : []).forEach((head, i) => {
      // the head's first score map (scaled) gives way to the next one present (a variant's, or
      // masked); every later score map is drawn too
      let scoreMap = null;
      for (const v of view.each) {
        const item = { key: `head${i}_${v.name}`, label: `heads.${i}.${v.name}`, title: `head ${i}: ${v.title}`, view: v, m: matrix(head[v.name]) };
        if (!item.m) continue;
        if (v.map === "scores" && scoreMap) { Object.assign(scoreMap, item); scoreMap = false; continue; }
        if (v.map === "scores" && scoreMap === null) scoreMap = item;
        items.push(item);
      }
      const sinks = sinkColumn(head);
      if (sinks) items.push({ key: `head${i}_${SINK_WEIGHTS}`, title: `head ${i}: sink weights`, view: { rows: "queries" }, m: sinks });
    });
  }

  const topSinks = sinkColumn(data);
  if (topSinks) items.push({ key: SINK_WEIGHTS, title: "sink weights", view: { rows: "queries" }, m: topSinks });

  const maskView = views.find((v) => v.map === "mask");
  const allowed = maskView ? matrix(data[maskView.name]) : undefined; // hatches masked cells of weights maps
  const labels = { queries: rows, keys: cols, index: [] };
  const maps = [];
  const tables = [];
  const drawn = []; // for "compare with my numbers" (compare.js): each output and its element
  for (const item of items) {
    const { key, title, view, m } = item;
    if (!m || !m.length) continue;
    if (view.map) maps.push(heatmap(key, title, m, rows, cols, view.map, view.map === "weights" ? allowed : null));
    else tables.push(table(key, title, m, labels[view.rows] || []));
    drawn.push({ ...item, el: view.map ? maps.at(-1) : tables.at(-1), rows: view.map ? rows : labels[view.rows] || [], cols: view.map ? cols : null });
  }
  $("heatmaps").replaceChildren(...maps);
  $("tables").replaceChildren(...tables);
  if (typeof MyNumbers !== "undefined") MyNumbers.afterRender({ ep, data, body: lastResult.body, batch: b, batched, drawn });

  $("steps").replaceChildren(...(data.steps || []).map((s) => {
    const li = document.createElement("li");
    const code = document.createElement("code"); code.textContent = s.formula;
    li.append(`${s.name}: `, code, `  [${s.shape.join(" × ")}]`);
    return li;
  }));
}

// ---- copy as curl -------------------------------------------------------------------------

function curlCommand(ep, body) {
  const url = new URL(ep, location.href).href;
  const json = JSON.stringify(body).replace(/'/g, "'\\''");
  return `curl -s ${url} -H 'Content-Type: application/json' -d '${json}'`;
}

async function copyCurl() {
  clearErrors();
  let body;
  try { body = buildBody(); } catch (e) { if (e instanceof FieldError) { showErrors(e.message, [{ field: e.field, message: e.message }]); return; } throw e; }
  const cmd = curlCommand($("endpoint").value, body);
  $("curl").textContent = cmd; $("curl").hidden = false;
  try { await navigator.clipboard.writeText(cmd); $("status").textContent = "curl command copied"; }
  catch { $("status").textContent = "curl command shown below (copy it from there)"; }
}

// ---- wiring -------------------------------------------------------------------------------

async function start() {
  $("form").addEventListener("submit", run);
  $("copy-curl").addEventListener("click", copyCurl);
  $("batch").addEventListener("change", render);
  $("mode").addEventListener("change", showFor);
  let examples = {};
  $("endpoint").addEventListener("change", async () => { showFor(); examples = await loadExamples(); });
  $("example").addEventListener("change", () => { const ex = examples[$("example").value]; if (ex) fillForm(ex.value); });
  showFor();
  examples = await loadExamples();
  const first = Object.keys(examples)[0];
  if (first) { $("example").value = first; fillForm(examples[first].value); }
  document.body.dataset.ready = "true";
}

start();
