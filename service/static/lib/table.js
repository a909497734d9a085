// @ts-check
// A matrix as a table card, a leaf: its first TABLE_ROWS rows, a CSV button, and (`onCell`) cells
// that a click or Enter reports. Imports only other leaves.
import { button } from "./state.js";
import { fmt } from "./format.js";
import { download, csvBlob } from "./files.js";

export const TABLE_ROWS = 64;

// A matrix as a table (the first TABLE_ROWS rows) in a card (compare.js adds its box and its
// difference map to the card). `onCell(i, j)`: as for heatmap() (heatmap.js).
export function table(key, title, m, rows, onCell = null) {
  const card = document.createElement("div");
  card.className = "table-card";
  card.dataset.name = key;
  const wrap = document.createElement("div");
  wrap.className = "table-scroll";
  const t = document.createElement("table");
  t.className = "matrix";
  t.dataset.name = key;
  const caption = t.createCaption();
  caption.textContent = `${title} [${m.length} × ${m[0].length}]${m.length > TABLE_ROWS ? ` — first ${TABLE_ROWS} rows` : ""} `;
  const csv = button("CSV", () => download(`${key}.csv`, csvBlob(m, rows, null)));
  csv.className = "secondary small";
  csv.setAttribute("aria-label", `Download ${title} as CSV`);
  caption.append(csv);
  const head = t.createTHead().insertRow();
  head.append(document.createElement("th"));
  m[0].forEach((_, j) => {
    const th = document.createElement("th");
    th.textContent = String(j);
    head.append(th);
  });
  const tbody = t.createTBody();
  m.slice(0, TABLE_ROWS).forEach((row, i) => {
    const tr = tbody.insertRow();
    const th = document.createElement("th");
    th.textContent = rows[i] ?? String(i);
    tr.append(th);
    row.forEach((v, j) => {
      const td = tr.insertCell();
      td.textContent = fmt(v);
      td.title = String(v);
      if (onCell) {
        td.tabIndex = 0;
        td.dataset.row = i;
        td.dataset.col = j;
        td.setAttribute("role", "button");
      }
    });
  });
  if (onCell) {
    t.classList.add("explainable");
    const fire = (td) => onCell(+td.dataset.row, +td.dataset.col);
    tbody.addEventListener("click", (e) => {
      const td = /** @type {Element} */ (e.target).closest("td[data-row]");
      if (td) fire(td);
    });
    tbody.addEventListener("keydown", (e) => {
      const target = /** @type {Element} */ (e.target);
      const td = target.closest && target.closest("td[data-row]");
      if (td && (e.key === "Enter" || e.key === " ")) {
        e.preventDefault();
        fire(td);
      }
    });
  }
  wrap.append(t);
  card.append(wrap);
  return card;
}
