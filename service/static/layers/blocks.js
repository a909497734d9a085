// @ts-check
// The online softmax block by block (API 2.10), for one query row (of one head on /multihead):
// the row's final scores split into the blocks the service read, the keys seen so far
// highlighted, and after each block the running max m, the rescaling factor exp(m_old − m_new),
// the running sum ℓ and output o, each computed again by the page from the block before
// (layers/online.js) beside the service's numbers; at the last block o beside the output row.
// First, prev, step and play move through the blocks. main.js registers drawOnline (whenDrawn).
import { $ } from "../lib/state.js";
import { NEG_INF, pick } from "../lib/pick.js";
import { el, fmt, table } from "../lib/explain-parts.js";
import { blocksOf, finalScores, rowBlocks, sinkOf, valuesOf } from "./online.js";

// what is shown, kept across redraws: the row, the head, the block, the answer's context
const view = { row: -1, head: 0, block: 0, ctx: null, timer: 0, started: false };

/** A number the test and the reader can check: six digits shown, the full double kept. */
function numberSpan(cls, page, service) {
  const s = el("span", cls, fmt(page));
  s.dataset.value = String(page);
  if (service !== undefined) s.dataset.service = String(service);
  return s;
}

function line(cls, ...parts) {
  const p = el("p", cls);
  p.append(...parts);
  return p;
}

/** Whether two of the row's numbers agree: equal, both −∞, or within float rounding (one unit of
 * the last decimal when the service rounded to `decimals`). */
function agrees(a, b, decimals) {
  if (a === b) return true;
  const tol = Number.isInteger(decimals) ? 10 ** -decimals : 1e-9 * Math.max(1, Math.abs(b));
  return Number.isFinite(a) && Number.isFinite(b) && Math.abs(a - b) <= tol;
}

function stopPlaying() {
  if (view.timer) clearInterval(view.timer);
  view.timer = 0;
  $("online-play").textContent = "play";
}

function start() {
  view.started = true;
  const go = (k) => {
    const n = view.ctx ? blocksOf(view.ctx).length : 0;
    view.block = Math.max(0, Math.min(n - 1, k));
    draw();
  };
  $("online-first").addEventListener("click", () => (stopPlaying(), go(0)));
  $("online-prev").addEventListener("click", () => (stopPlaying(), go(view.block - 1)));
  $("online-step").addEventListener("click", () => (stopPlaying(), go(view.block + 1)));
  $("online-play").addEventListener("click", () => {
    if (view.timer) return stopPlaying();
    const n = view.ctx ? blocksOf(view.ctx).length : 0;
    if (view.block >= n - 1) go(0);
    $("online-play").textContent = "pause";
    view.timer = window.setInterval(() => {
      if (view.block >= n - 1) return stopPlaying();
      go(view.block + 1);
    }, 900);
  });
  $("online-row").addEventListener("change", () => {
    view.row = Number($("online-row").value);
    draw();
  });
  $("online-head").addEventListener("change", () => {
    view.head = Number($("online-head").value);
    view.ctx = { ...view.ctx, head: view.head };
    draw();
  });
}

/** The hook render.js calls once the answer is drawn: shows the section when the answer has
 * online_softmax (at the top level, or in a head's trace). */
export function drawOnline({ ep, data, body, batch, batched }) {
  if (!view.started) start();
  stopPlaying();
  const heads = Array.isArray(data.heads)
    ? data.heads.flatMap((h, n) => (h && Array.isArray(h.online_softmax) ? [n] : []))
    : [];
  const onTop = Array.isArray(data.online_softmax) && data.online_softmax.length > 0;
  $("online").hidden = !onTop && !heads.length;
  if ($("online").hidden) {
    view.ctx = null;
    $("online-body").replaceChildren();
    return;
  }
  if (!onTop && !heads.includes(view.head)) view.head = heads[0];
  const head = onTop ? null : view.head;
  view.ctx = { endpoint: ep, data, request: body, head, batch: batched ? batch : null };
  $("online-head-label").hidden = onTop;
  $("online-head").replaceChildren(...heads.map((h) => new Option(`head ${h}`, String(h))));
  if (!onTop) $("online-head").value = String(view.head);
  const L = blocksOf(view.ctx)[0].m.length;
  const tokens = data.tokens;
  $("online-row").replaceChildren(
    ...Array.from({ length: L }, (_, i) => {
      const t = Array.isArray(tokens) && tokens[i] !== undefined ? ` “${tokens[i]}”` : "";
      return new Option(`query ${i}${t}`, String(i));
    }),
  );
  if (view.row < 0 || view.row >= L) view.row = L - 1; // the last row sees every key when causal
  $("online-row").value = String(view.row);
  view.block = 0;
  draw();
}

function draw() {
  const ctx = view.ctx;
  if (!ctx) return;
  const i = view.row;
  const rows = rowBlocks(ctx, i);
  const blocks = blocksOf(ctx);
  const scores = finalScores(ctx);
  if (!rows || !blocks || !scores) {
    $("online-body").replaceChildren(el("p", "hint", "No online softmax to show for this row."));
    return;
  }
  const k = Math.min(view.block, rows.length - 1);
  const { page: P, service: S } = rows[k];
  const n = rows.length;
  const last = k === n - 1;
  $("online-where").textContent = `block ${k + 1} of ${n}: keys ${P.a}…${P.b - 1}`;
  const box = el("div", "online-block");
  box.dataset.block = String(k);
  box.dataset.row = String(i);
  if (ctx.head !== null) box.dataset.head = String(ctx.head);
  const tokens = ctx.data.tokens,
    keyTokens = ctx.data.context_tokens || tokens;
  const who = Array.isArray(tokens) && tokens[i] !== undefined ? ` “${tokens[i]}”` : "";
  const head = ctx.head === null ? "" : ` (head ${ctx.head})`;
  box.append(
    el(
      "h3",
      "online-title",
      `query ${i}${who}${head}: block ${k + 1} of ${n}, keys ${P.a}…${P.b - 1}`,
    ),
  );
  box.append(strip(scores, i, blocks, k, keyTokens));
  const sink = sinkOf(ctx);
  const decimals = ctx.request.decimals;
  const f = (...parts) => box.append(line("explain-formula", ...parts));
  const note = (s) => box.append(el("p", "explain-note", s));
  if (k === 0)
    note(
      sink === null
        ? "Before the first block the row has seen nothing: m = −∞, ℓ = 0, o = 0."
        : `With a sink every row starts at m = sink = ${fmt(sink)}, ℓ = 1 (its exp(sink − m)), o = 0 (it has no value).`,
    );
  else
    note(
      `m_old, ℓ_old and o_old are the service's state after block ${k} (keys up to ${P.a - 1}).`,
    );
  // the max
  f(
    `max of this block's scores = ${fmt(P.blockMax)}; m_new = max(m_old, block max) = max(${fmt(P.mOld)}, ${fmt(P.blockMax)}) = `,
    numberSpan("online-m", P.m, S.m),
  );
  // the rescaling factor
  f(
    `rescaling factor exp(m_old − m_new) = exp(${fmt(P.mOld)} − ${fmt(P.m)}) = `,
    numberSpan("online-rescale", P.rescale),
  );
  if (P.mOld === NEG_INF)
    note("m_old is −∞: nothing was summed before, so the factor is 0 and only this block counts.");
  else if (P.rescale === 1)
    note("The max did not change: what was summed so far keeps its scale (factor 1).");
  else
    note(
      `The max rose by ${fmt(P.m - P.mOld)}: every exp(s − m) summed so far was taken against the old max, so it shrinks by this factor.`,
    );
  box.append(
    table(
      ["key j", `s_j = ${scores.name}[${i}][j]`, "s_j − m_new", "exp(s_j − m_new)"],
      P.terms.map((t) => [
        String(t.j),
        fmt(t.s),
        t.s === NEG_INF ? "−∞" : fmt(t.s - P.m),
        fmt(t.p),
      ]),
    ),
  );
  // the sum
  f(
    `ℓ_new = ℓ_old · exp(m_old − m_new) + Σ_j exp(s_j − m_new) = ${fmt(P.lOld)} · ${fmt(P.rescale)} + ${fmt(P.sumP)} = `,
    numberSpan("online-l", P.l, S.l),
  );
  // the output
  const vName = valuesOf(ctx).name;
  f(
    `o_new[c] = (o_old[c] · ℓ_old · exp(m_old − m_new) + Σ_j exp(s_j − m_new) · ${vName}[j][c]) / ℓ_new`,
  );
  box.append(outputTable(P, S, vName));
  const same =
    agrees(P.m, S.m, decimals) &&
    agrees(P.l, S.l, decimals) &&
    P.o.every((x, c) => agrees(x, S.o[c], decimals));
  const check = el(
    "p",
    "explain-total online-check",
    same
      ? "The page's m, ℓ and o after this block are the service's."
      : "The page's numbers differ from the service's (marked above).",
  );
  if (!same) check.classList.add("explain-mismatch");
  box.append(check);
  if (last) box.append(finalRow(ctx, i, P, S));
  $("online-body").replaceChildren(box);
}

/** The row's scores in their blocks: keys already seen, this block's, those still ahead. */
function strip(scores, i, blocks, k, keyTokens) {
  const t = el("table", "online-strip");
  t.append(el("caption", null, `row ${i} of ${scores.name}, in blocks of keys`));
  const head = el("tr");
  const vals = el("tr");
  head.append(el("th", null, "key"));
  vals.append(el("th", null, "s"));
  const row = scores.m[i];
  const [a, b] = blocks[k].keys;
  const starts = new Set(blocks.map((e) => e.keys[0]));
  row.forEach((s, j) => {
    const where = j < a ? "seen" : j < b ? "current" : "ahead";
    const name = Array.isArray(keyTokens) && keyTokens[j] !== undefined ? ` ${keyTokens[j]}` : "";
    const th = el("th", `${where}${starts.has(j) ? " block-start" : ""}`, `${j}${name}`);
    const td = el("td", `${where}${starts.has(j) ? " block-start" : ""}`, fmt(s));
    td.dataset.col = String(j);
    head.append(th);
    vals.append(td);
  });
  t.append(head, vals);
  return t;
}

function outputTable(P, S, vName) {
  const t = el("table", "explain-terms online-o-table");
  const hr = el("tr");
  for (const h of [
    "c",
    "o_old[c]",
    "· ℓ_old · exp(m_old − m_new)",
    `Σ_j exp(s_j − m_new) · ${vName}[j][c]`,
    "o_new[c]",
    "the service",
  ])
    hr.append(el("th", null, h));
  t.append(hr);
  P.o.forEach((o, c) => {
    const tr = el("tr");
    const mine = el("td", "online-o", fmt(o));
    Object.assign(mine.dataset, { col: String(c), value: String(o), service: String(S.o[c]) });
    tr.append(
      el("td", null, String(c)),
      el("td", null, fmt(P.oOld[c])),
      el("td", null, fmt(P.kept[c])),
      el("td", null, fmt(P.pv[c])),
      mine,
      el("td", "online-service", fmt(S.o[c])),
    );
    t.append(tr);
  });
  return t;
}

/** The last block: o is the output row, side by side. */
function finalRow(ctx, i, P, S) {
  const box = el("div", "online-final");
  const out = pick(ctx, "output");
  const row = Array.isArray(out) ? out[i] : undefined;
  box.append(
    el(
      "p",
      "explain-formula",
      `This is the last block: o = output[${i}] = Σ_j weights[${i}][j] · v_j, reached without ever holding the whole row of scores.`,
    ),
  );
  if (!P.seen)
    box.append(
      el(
        "p",
        "explain-note",
        `Row ${i} met no allowed key: its o stays 0${ctx.request.fully_masked_rows === "uniform" ? ' (the output row is the uniform average of fully_masked_rows: "uniform", which the online softmax does not make)' : ""}.`,
      ),
    );
  if (!row) return box;
  const t = el("table", "explain-terms online-final-table");
  const hr = el("tr");
  for (const h of ["c", "o (page)", "o (service, last block)", `output[${i}][c]`])
    hr.append(el("th", null, h));
  t.append(hr);
  P.o.forEach((o, c) => {
    const tr = el("tr");
    const page = el("td", "online-final-o", fmt(o));
    page.dataset.value = String(o);
    const given = el("td", null, fmt(S.o[c]));
    const output = el("td", "online-final-output", fmt(row[c]));
    output.dataset.value = String(row[c]);
    page.dataset.col = output.dataset.col = String(c);
    tr.append(el("td", null, String(c)), page, given, output);
    t.append(tr);
  });
  box.append(t);
  const diff = Math.max(...P.o.map((o, c) => Math.abs(o - row[c])));
  box.append(
    el(
      "p",
      "explain-note",
      `The largest difference between o and the output row: ${fmt(diff, 3)}.`,
    ),
  );
  return box;
}
