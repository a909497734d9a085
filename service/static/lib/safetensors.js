// @ts-check
// Reading a safetensors answer (the service's `Accept: application/x-safetensors`) back into the
// shape of its JSON answer, much faster than JSON.parse for large arrays: an 8-byte little-endian
// header length, a JSON header with dtype, shape and data_offsets per tensor (named by its dotted
// JSON path) and the rest of the answer as JSON under __metadata__.json, then the bytes.

const READ = {
  F64: [Float64Array, 8],
  F32: [Float32Array, 4],
  I64: [BigInt64Array, 8],
  I32: [Int32Array, 4],
  U8: [Uint8Array, 1],
  BOOL: [Uint8Array, 1],
};

// A flat typed array as nested rows of `shape`; a non-finite float is null, as in the JSON.
function nest(flat, shape, dtype) {
  const conv =
    dtype === "BOOL"
      ? (v) => v !== 0
      : dtype === "I64"
        ? (v) => Number(v)
        : dtype.startsWith("F")
          ? (v) => (Number.isFinite(v) ? v : null)
          : (v) => v;
  const build = (offset, d) => {
    const n = shape[d];
    if (d === shape.length - 1) {
      const row = new Array(n);
      for (let k = 0; k < n; k++) row[k] = conv(flat[offset + k]);
      return row;
    }
    const stride = shape.slice(d + 1).reduce((a, b) => a * b, 1);
    const out = new Array(n);
    for (let k = 0; k < n; k++) out[k] = build(offset + k * stride, d + 1);
    return out;
  };
  return shape.length ? build(0, 0) : conv(flat[0]);
}

function put(root, path, value) {
  const keys = path.split(".");
  let node = root;
  keys.slice(0, -1).forEach((k, d) => {
    const next = keys[d + 1];
    if (node[k] === undefined || node[k] === null) node[k] = /^\d+$/.test(next) ? [] : {};
    node = node[k];
  });
  node[keys.at(-1)] = value;
}

/** The JSON answer that `buffer` (a safetensors response) carries. */
export function readSafetensors(buffer) {
  const view = new DataView(buffer);
  const n = Number(view.getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(new Uint8Array(buffer, 8, n)));
  const meta = header.__metadata__ || {};
  const data = meta.json ? JSON.parse(meta.json) : {};
  const start = 8 + n;
  for (const [name, t] of Object.entries(header)) {
    if (name === "__metadata__") continue;
    const [Type, size] = READ[t.dtype] || [];
    if (!Type) throw new Error(`safetensors: cannot read dtype ${t.dtype} of ${name}`);
    const [begin, end] = t.data_offsets;
    const at = start + begin,
      count = (end - begin) / size;
    const flat =
      at % size === 0 ? new Type(buffer, at, count) : new Type(buffer.slice(at, start + end));
    put(data, name, nest(flat, t.shape, t.dtype));
  }
  return data;
}
