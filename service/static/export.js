// @ts-check
// Export: SVG/PNG of a map, copy as curl, CSV of a matrix, the whole result as JSON or safetensors.
import { $, state, formBody } from "./request.js";
import { drawWhole } from "./mapview.js";

export function download(name, blob) {
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

// The whole map, at most PNG_SIDE px a side (a cell is then less than a pixel: neighbours averaged).
const PNG_SIDE = 2048;
export function exportPng(name, m, rows, cols, kind, allowed) {
  const fit = PNG_SIDE / Math.max(cols.length, rows.length);
  const cell = Math.min(40, fit >= 1 ? Math.floor(fit) : fit); // whole pixels a cell from 1 up
  const canvas = document.createElement("canvas");
  drawWhole(canvas, m, kind, cell, allowed);
  canvas.toBlob((blob) => download(`${name}.png`, blob), "image/png");
}

// ---- copy as curl -------------------------------------------------------------------------

export function curlCommand(ep, body) {
  const url = new URL(ep, location.href).href;
  const json = JSON.stringify(body).replace(/'/g, "'\\''");
  return `curl -s ${url} -H 'Content-Type: application/json' -d '${json}'`;
}

export async function copyCurl() {
  const body = formBody();
  if (body === undefined) return;
  const cmd = curlCommand($("endpoint").value, body);
  $("curl").textContent = cmd;
  $("curl").hidden = false;
  $("curl").dataset.body = JSON.stringify(body); // whose request it is (render.js: markStale)
  try {
    await navigator.clipboard.writeText(cmd);
    $("status").textContent = "curl command copied";
  } catch {
    $("status").textContent = "curl command shown below (copy it from there)";
  }
}

// ---- CSV, JSON and safetensors --------------------------------------------------------------

function csvCell(v) {
  const s = v === null || v === undefined ? "" : String(v);
  return /[",\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
}

/** A matrix as CSV: a header of column labels, then one line per row led by its label; numbers
 * at full precision, a masked (null) cell empty. */
export function csvBlob(m, rows, cols) {
  const width = m.length ? m[0].length : 0;
  const colLabels =
    cols && cols.length === width ? cols : Array.from({ length: width }, (_, j) => String(j));
  const lines = [["", ...colLabels].map(csvCell).join(",")];
  m.forEach((row, i) =>
    lines.push(
      [rows && rows[i] !== undefined ? rows[i] : String(i), ...row].map(csvCell).join(","),
    ),
  );
  return new Blob([lines.join("\n") + "\n"], { type: "text/csv" });
}

function downloadJson() {
  const r = state.lastResult;
  if (!r) return;
  download(
    `${r.ep}.json`,
    new Blob([JSON.stringify(r.data, null, 1)], { type: "application/json" }),
  );
}

// The same request again, answered as safetensors (every array a tensor named by its JSON path).
async function downloadSafetensors() {
  const r = state.lastResult;
  if (!r) return;
  const status = $("export-status");
  status.textContent = "Asking for safetensors…";
  let response;
  try {
    response = await fetch(r.ep, {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "application/x-safetensors" },
      body: JSON.stringify(r.body),
    });
  } catch (e) {
    status.textContent = `The service did not answer: ${e.message}`;
    return;
  }
  if (!response.ok) {
    status.textContent = `Error ${response.status}`;
    return;
  }
  download(`${r.ep}.safetensors`, await response.blob());
  status.textContent = "";
}

export function startExports() {
  $("export-json").addEventListener("click", downloadJson);
  $("export-safetensors").addEventListener("click", downloadSafetensors);
}
