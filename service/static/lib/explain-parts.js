// @ts-check
// The parts every cell explanation is made of, a leaf (explain.js, layers/explain.js): numbers at
// six significant digits, elements, a table of terms, and the page's total beside the service's.
import { formatNumber, count } from "./format.js";
import { NEG_INF } from "./pick.js";

/** Six significant digits, trailing zeros kept (a column of terms lines up); −∞ for a masked
 * score (null or -Infinity). */
export function fmt(x, digits = 6) {
  return formatNumber(x === undefined || x === NEG_INF ? null : x, digits, false);
}

export function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

/** An explanation's title: the cell `cell` ("weights[2][3]") and, when the cell is one head's
 * or one batch item's, which ("weights[2][3] (head 1, batch item 0)"). */
export function cellTitle(cell, ctx) {
  const where = [];
  if (ctx.head !== null && ctx.head !== undefined) where.push("head " + ctx.head);
  if (ctx.kv !== null && ctx.kv !== undefined) where.push("key/value head " + ctx.kv);
  if (ctx.batch !== null && ctx.batch !== undefined) where.push("batch item " + ctx.batch);
  return el("h3", "explain-title", cell + (where.length ? ` (${where.join(", ")})` : ""));
}

/** A table of terms; row `mark` (the clicked cell's own term) is highlighted. */
export function table(head, rows, mark = -1) {
  const t = el("table", "explain-terms");
  const hr = el("tr");
  for (const h of head) hr.append(el("th", null, h));
  t.append(hr);
  for (const [n, r] of rows.entries()) {
    const tr = el("tr", n === mark ? "this-term" : null);
    for (const c of r) tr.append(el("td", null, c));
    t.append(tr);
  }
  return t;
}

// The page's total beside the service's number. With `decimals` the service rounds every
// number it returns (the page then adds up rounded numbers): one unit of the last decimal apart
// still agrees.
export function totalLine(total, service, decimals) {
  const p = el("p", "explain-total", "= " + fmt(total) + " ");
  p.dataset.total = String(total); // the page's number in full, and the service's
  p.dataset.service = String(service);
  const rounded = Number.isInteger(decimals);
  const tol = rounded ? 10 ** -decimals : 1e-9 * Math.max(1, Math.abs(service ?? 0));
  const same =
    (total === NEG_INF && (service === null || service === NEG_INF)) ||
    (typeof service === "number" && Math.abs(total - service) <= tol);
  if (!same) p.classList.add("explain-mismatch");
  p.append(
    rounded ? `(the service, rounded to ${count(decimals, "decimal")}: ` : "(the service: ",
    el("span", "explain-service", fmt(service === null ? NEG_INF : service)),
    ")",
  );
  return p;
}

/** The page's total beside the service's (totalLine), or, where the page computes none
 * (`total` undefined), the service's number alone. */
export function totalOrService(total, service, decimals) {
  return total === undefined
    ? el("p", "explain-total", `= ${fmt(service)} (the service's number)`)
    : totalLine(total, service, decimals);
}

/** The button that walks back to the cell `label` came from ("← how … was computed"); its
 * dataset (step, i, j, and a head where it has one) says which cell render.js explains next. */
export function backButton(label, dataset) {
  const button = el("button", "secondary explain-back", `← how ${label} was computed`);
  button.type = "button";
  Object.assign(button.dataset, dataset);
  return button;
}
