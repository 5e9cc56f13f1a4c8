// For tests/test_web_preprocess.py: resize raw RGB pictures with the page's resizeBilinear in one node process.
// Usage: node resize_cli.mjs JOBS.json, where JOBS.json lists {path, width, height, size, out}: `path` holds
// (height, width, 3) uint8 RGB row-major, `out` receives (3, size, size) uint8 row-major.

import { readFileSync, writeFileSync } from "node:fs";
import { resizeBilinear } from "../../captioner/deploy/web/preprocess.js";

for (const { path, width, height, size, out } of JSON.parse(readFileSync(process.argv[2], "utf8"))) {
  writeFileSync(out, resizeBilinear(new Uint8Array(readFileSync(path)), width, height, size));
}
