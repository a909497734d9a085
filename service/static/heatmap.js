// @ts-check
// A map's card: SVG with the value in every cell for a small map (lib/svg.js), a zoomable canvas
// (mapview.js) with its handlers and zoom bar for a large one, its legend and its SVG, PNG and
// CSV buttons; and small maps laid out side by side. A click or Enter on a cell calls the
// card's `onCell` (the caller's explanation hook).
import { button } from "./lib/state.js";
import { fmt, maxAbs, isMasked } from "./lib/format.js";
import { download, csvBlob } from "./lib/files.js";
import { svgString, legendSvg, anyMasked, MAP_AXES } from "./lib/svg.js";
import { exportPng } from "./lib/picture.js";
import { MapView, zoomText, LABEL_W, LABEL_H } from "./mapview.js";

export const SMALL_MAP = 24 * 24; // up to this many cells: SVG with the value in every cell
const SVG_MOST = 160 * 160; // the most cells an SVG export holds (one shape a cell)

// A card with a map: SVG with every value for a small one, a canvas with a keyboard cursor for a
// large one. `onCell(i, j)` (optional): a click or Enter on a cell (the explanation hook);
// `axes`: the names of its rows and columns (queries and keys unless said).
export function heatmap(key, title, m, rows, cols, kind, allowed, onCell = null, axes = MAP_AXES) {
  const fig = document.createElement("figure");
  fig.className = "heatmap";
  fig.dataset.name = key;
  const scale = maxAbs(m); // the colours' and the legend's range
  const caption = document.createElement("figcaption");
  caption.append(title);
  const svgButton = button("SVG", () =>
    download(
      `${key}.svg`,
      new Blob(
        [svgString(title, m, rows, cols, kind, rows.length * cols.length <= SMALL_MAP, allowed)],
        { type: "image/svg+xml" },
      ),
    ),
  );
  if (rows.length * cols.length > SVG_MOST) {
    svgButton.disabled = true;
    svgButton.title = `${rows.length} × ${cols.length} cells are too many for an SVG (a shape each): use PNG or CSV`;
  }
  const pngButton = button("PNG", () => exportPng(key, m, rows, cols, kind, allowed));
  const csvButton = button("CSV", () => download(`${key}.csv`, csvBlob(m, rows, cols)));
  svgButton.setAttribute("aria-label", `Download ${title} as SVG`);
  pngButton.setAttribute("aria-label", `Download ${title} as PNG`);
  csvButton.setAttribute("aria-label", `Download ${title} as CSV`);
  caption.append(svgButton, pngButton, csvButton);
  fig.append(caption);
  const scroll = document.createElement("div");
  scroll.className = "map-scroll";
  const readout = document.createElement("div");
  readout.className = "cell-readout";
  readout.setAttribute("aria-live", "polite");
  const say = (i, j) => {
    readout.textContent = `${rows[i]} → ${cols[j]}: ${fmt(m[i][j])}${isMasked(m, allowed, i, j) ? " (masked)" : ""}`;
  };
  if (onCell) fig.classList.add("explainable");
  if (rows.length * cols.length <= SMALL_MAP) {
    scroll.innerHTML = svgString(title, m, rows, cols, kind, true, allowed, false, !!onCell, axes);
    scroll.addEventListener("mouseover", (e) => {
      const c = /** @type {SVGElement} */ (/** @type {Element} */ (e.target).closest("rect.cell"));
      if (c) say(+c.dataset.row, +c.dataset.col);
    });
    scroll.addEventListener("focusin", (e) => {
      const c = /** @type {SVGElement} */ (/** @type {Element} */ (e.target).closest("rect.cell"));
      if (c) say(+c.dataset.row, +c.dataset.col);
    });
    if (onCell) {
      scroll.addEventListener("click", (e) => {
        const c = /** @type {SVGElement} */ (
          /** @type {Element} */ (e.target).closest("rect.cell")
        );
        if (c) onCell(+c.dataset.row, +c.dataset.col);
      });
      scroll.addEventListener("keydown", (e) => {
        const target = /** @type {Element} */ (e.target);
        const c = /** @type {SVGElement} */ (target.closest && target.closest("rect.cell"));
        if (c && (e.key === "Enter" || e.key === " ")) {
          e.preventDefault();
          onCell(+c.dataset.row, +c.dataset.col);
        }
      });
    }
  } else {
    canvasMap(fig, scroll, { title, m, rows, cols, kind, allowed, scale, onCell, say, axes });
  }
  const legend = document.createElement("div");
  legend.className = "legend-box";
  legend.innerHTML = legendSvg(kind, scale, anyMasked(m, allowed));
  fig.append(scroll, legend, readout);
  return fig;
}

/**
 * A large map's canvas, its zoom bar and its handlers, put into `fig` and `scroll`: hover or the
 * arrow keys read a cell (`say(i, j)`), a click or Enter calls `onCell(i, j)`, dragging or the
 * wheel pans, ctrl+wheel or + and − zoom. `fig.markCell(i, j)` outlines a cell and brings it
 * into view. Drawn once the card has a width (a hidden map is drawn when first shown).
 */
export function canvasMap(
  fig,
  scroll,
  { title, m, rows, cols, kind, allowed, scale, onCell, say, axes = ["queries", "keys"] },
) {
  const canvas = document.createElement("canvas");
  canvas.tabIndex = 0;
  canvas.dataset.rows = String(m.length);
  canvas.dataset.cols = String(m[0].length);
  canvas.setAttribute("role", "img");
  canvas.setAttribute(
    "aria-label",
    `${title}: ${m.length} × ${m[0].length}; arrow keys read cells, + and − zoom${onCell ? ", Enter explains a cell" : ""}`,
  );
  const size = document.createElement("span");
  size.className = "zoom-size";
  const where = document.createElement("span");
  where.className = "zoom-where";
  const status = () => {
    // the zoom bar says how far in and which part is shown
    const v = view.visible();
    size.textContent = zoomText(view.cell);
    const rowsShown = Math.min(m.length, Math.ceil(v.rows)),
      colsShown = Math.min(m[0].length, Math.ceil(v.cols));
    where.textContent =
      rowsShown >= m.length && colsShown >= m[0].length
        ? "the whole map"
        : `${axes[0]} ${view.top | 0}–${Math.min(m.length, (view.top | 0) + rowsShown) - 1}, ${axes[1]} ${view.left | 0}–${Math.min(m[0].length, (view.left | 0) + colsShown) - 1} of ${m.length} × ${m[0].length}; drag to pan`;
  };
  const view = new MapView(canvas, m, rows, cols, kind, allowed, scale, status, axes);
  new ResizeObserver(() => view.resize(Math.min(scroll.clientWidth, 1600))).observe(scroll);

  let drag = null; // pointer panning; a drag is not a click
  canvas.addEventListener("pointerdown", (e) => {
    drag = { x: e.clientX, y: e.clientY, moved: false };
  });
  canvas.addEventListener("pointermove", (e) => {
    if (drag && e.buttons) {
      const dx = e.clientX - drag.x,
        dy = e.clientY - drag.y;
      if (Math.abs(dx) + Math.abs(dy) > 4) drag.moved = true;
      if (drag.moved) {
        canvas.setPointerCapture(e.pointerId);
        view.pan(-dx, -dy);
        drag.x = e.clientX;
        drag.y = e.clientY;
      }
      return;
    }
    const c = view.at(e);
    if (c) say(c[0], c[1]);
  });
  canvas.addEventListener("click", (e) => {
    const moved = drag && drag.moved;
    drag = null;
    if (moved) return;
    const c = view.at(e);
    if (!c) return;
    view.setCursor(c);
    say(c[0], c[1]);
    if (onCell) onCell(c[0], c[1]);
  });
  canvas.addEventListener(
    "wheel",
    (e) => {
      const r = canvas.getBoundingClientRect();
      if (e.ctrlKey) {
        // pinch or ctrl+wheel: zoom about the pointer
        e.preventDefault();
        view.zoom(
          view.cell * (e.deltaY < 0 ? 2 : 0.5),
          e.clientX - r.left - LABEL_W,
          e.clientY - r.top - LABEL_H,
        );
        return;
      }
      const before = [view.top, view.left];
      view.pan(e.shiftKey ? e.deltaY : e.deltaX, e.shiftKey ? 0 : e.deltaY);
      if (view.top !== before[0] || view.left !== before[1]) e.preventDefault(); // at an edge the page scrolls
    },
    { passive: false },
  );
  const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
  canvas.addEventListener("keydown", (e) => {
    if (onCell && e.key === "Enter") {
      e.preventDefault();
      onCell(...(view.cursor || [0, 0]));
      return;
    }
    if (e.key === "+" || e.key === "=") {
      e.preventDefault();
      view.zoom(view.cell * 2);
      return;
    }
    if (e.key === "-") {
      e.preventDefault();
      view.zoom(view.cell / 2);
      return;
    }
    if (!moves[e.key]) return;
    e.preventDefault();
    const c = view.cursor || [0, 0];
    view.setCursor([
      Math.max(0, Math.min(m.length - 1, c[0] + moves[e.key][0])),
      Math.max(0, Math.min(m[0].length - 1, c[1] + moves[e.key][1])),
    ]);
    say(view.cursor[0], view.cursor[1]);
  });
  canvas.addEventListener("focus", () => {
    if (!view.cursor) view.setCursor([0, 0]);
    say(view.cursor[0], view.cursor[1]);
  });
  fig.markCell = (i, j) => view.mark(i, j);

  const zoomBar = document.createElement("div");
  zoomBar.className = "zoom";
  const zbutton = (text, label, act) => {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = text;
    b.setAttribute("aria-label", label);
    b.addEventListener("click", act);
    return b;
  };
  zoomBar.append(
    "Zoom ",
    zbutton("−", `Zoom out of ${title}`, () => view.zoom(view.cell / 2)),
    zbutton("+", `Zoom in on ${title}`, () => view.zoom(view.cell * 2)),
    zbutton("fit", `Fit ${title} to the card`, () => view.fit()),
    size,
    where,
  );
  fig.append(zoomBar);
  fig.classList.add("large");
  scroll.append(canvas);
  return view;
}

// Small maps (SVG, a value in every cell) side by side in a grid whose columns are a little
// narrower than the widest map (each map scales to its column); large maps (canvas) keep their
// row. `--map-min`: the columns' least width.
const GRID_UP_TO = 480; // px: the widest SVG map drawn in a grid
export function smallMapsGrid(container) {
  const figures = [...container.querySelectorAll("figure.heatmap")];
  const widths = figures.map((f) => {
    const svg = f.querySelector(".map-scroll > svg");
    return svg ? Number(svg.getAttribute("width")) : Infinity;
  });
  const widest = Math.max(0, ...widths);
  const small = figures.length > 0 && widest <= GRID_UP_TO;
  container.classList.toggle("small-maps", small);
  if (small)
    container.style.setProperty("--map-min", `${Math.max(190, Math.round(widest * 0.7))}px`);
  else container.style.removeProperty("--map-min");
}
