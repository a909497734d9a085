// @ts-check
// Files the page hands the browser, a leaf: a download of a blob, and a matrix as a CSV blob.
// Imports nothing.

export function download(name, blob) {
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

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
