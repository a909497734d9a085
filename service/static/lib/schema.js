// @ts-check
// What the service's OpenAPI document (state.spec) says of its answers, a leaf: the x-view of
// each drawable output (title, map, rows, each_head, chain), the steps of one head and of the
// block after the heads (x-chain), and the floor under which a compared score counts as masked.
import { state } from "./state.js";
import { isStack } from "./format.js";

/**
 * What the schema's x-view says of one output (see below): a map's colours or a table's rows, or
 * (`each`) the views of every item of a per-head list.
 * @typedef {{name?: string, title?: string, map?: string | null, rows?: string, each_head?: boolean,
 *   chain?: boolean, each?: View[], grad?: string}} View
 */

// The service describes each drawable output in its OpenAPI document: the property of the
// endpoint's response schema carries `x-view` {title, map, rows, each_head, chain}, and property
// order is drawing order. `map` names a heatmap's colours (scores, weights, mask); without one the output is
// a table whose rows are the query tokens, the key tokens or plain indices. A property holding a
// list of objects whose own properties carry x-view (the per-head traces of /multihead) is drawn
// once per item, for the entries marked each_head.

export function resolveRef(ref) {
  return ref
    .replace(/^#\//, "")
    .split("/")
    .reduce((o, k) => (o ? o[k] : undefined), state.spec);
}

// The backward (API "The backward pass, every step"): the gradient of an output is the property
// of the same schema named grad_ + its name; a view whose schema has one carries its name (`grad`),
// drawn beside it when the answer holds it.
export const GRAD_PREFIX = "grad_";
// the arrays whose gradients /multihead's answer holds per key/value head at its top level,
// [h_kv][rows][·]: the cache's, and under grouped-query heads the keys' and values' (API
// "Gradients")
export const PER_KV = new Set(["k", "v", "past_k", "past_v"]);

export function viewsOf(schema) {
  const views = [];
  const props = (schema && schema.properties) || {};
  for (const [name, prop] of Object.entries(props)) {
    const view = prop["x-view"];
    if (view) {
      const grad = props[GRAD_PREFIX + name] ? { grad: GRAD_PREFIX + name } : {};
      views.push({ ...view, name, map: view.map || null, ...grad });
      continue;
    }
    for (const alt of prop.anyOf || prop.oneOf || [prop]) {
      // a nullable property is anyOf [..., null]
      const item =
        alt.type === "array" && alt.items && alt.items.$ref ? resolveRef(alt.items.$ref) : null;
      const each = viewsOf(item).filter((v) => v.each_head && !v.each);
      if (each.length) {
        views.push({ name, each });
        break;
      }
    }
  }
  return views;
}

export const viewCache = new Map();
export function responseViews(ep) {
  if (!viewCache.has(ep)) {
    const schema =
      state.spec.paths[`/${ep}`].post.responses["200"].content["application/json"].schema;
    viewCache.set(ep, viewsOf(schema.$ref ? resolveRef(schema.$ref) : schema));
  }
  return viewCache.get(ep);
}

// The first heatmap in the answer (top level first, then the first item of a per-head list), as
// returned: [L][S], or [B][L][S] when the request was batched.
export function firstMap(ep, data) {
  const views = responseViews(ep);
  for (const v of views) if (v.map && data[v.name]) return data[v.name];
  for (const v of views)
    if (v.each && Array.isArray(data[v.name]) && data[v.name][0]) {
      for (const e of v.each) if (e.map && data[v.name][0][e.name]) return data[v.name][0][e.name];
    }
  return null;
}

export function isBatched(ep, data) {
  return isStack(firstMap(ep, data));
}

// The names of an output's axes, rows then columns, from its x-view: a map is queries × keys; a
// table's rows are the queries, the keys or plain indices, and its columns features.
const ROW_NAMES = { queries: "queries", keys: "keys", index: "rows" };
export function axesOf(view) {
  return view.map ? ["queries", "keys"] : [ROW_NAMES[view.rows] || "rows", "features"];
}

/** The score at or below which a compared score counts as masked (as masked_fill(-1e9) leaves
 * it): the schema's Compared component carries it as x-masked-floor. */
export function maskedFloor() {
  return state.spec.components.schemas.Compared["x-masked-floor"];
}

/**
 * One step of the chain: the intermediate it makes, what it does (clip, norm, rotate, scale,
 * softmax, gated, …), the slot it reads and the slot whose latest form it makes (q, k, v,
 * scores, weights, out, block).
 * @typedef {{name: string, kind: string, reads: string, advances: string}} ChainStep
 */

/** The steps of one head, then those of the block after the heads, in the order the service
 * runs them (the document's x-chain: the service's HEAD and BLOCK, service/core/chain.py), a
 * step stated twice where it can run at two places (qk_norm before RoPE or after it); [] before
 * the document is loaded.
 * @returns {ChainStep[]} */
export function chainSteps() {
  return (state.spec && state.spec["x-chain"]) || [];
}
