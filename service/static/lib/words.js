// @ts-check
// Counted words, a leaf: a noun agreeing with its number ("1 decimal", "2 decimals", "1 query",
// "3 queries"), for every sentence of the page that counts something. Imports nothing.

/** `one` when `n` is 1, else `many` (`one` + "s" unless given): plural(1, "has", "have"). */
export function plural(n, one, many = `${one}s`) {
  return n === 1 ? one : many;
}

/** `n` and its noun, agreeing: count(1, "decimal") is "1 decimal", count(2, "query", "queries")
 * "2 queries". */
export function count(n, one, many = `${one}s`) {
  return `${n} ${plural(n, one, many)}`;
}
