// The page's preprocessing (captioner/deploy/web/preprocess.js) on cases small enough to check by hand; the
// byte-exact comparison with Pillow on many sizes is tests/test_web_preprocess.py.

import assert from "node:assert/strict";
import { test } from "node:test";

import { checkPixels, headerSize, MAX_PIXELS, resizeBilinear } from "../../captioner/deploy/web/preprocess.js";

// (3, 4, 3): 3 rows of 4 RGB pixels, row-major.
const PICTURE = Uint8Array.from([
  0, 10, 200, 255, 20, 100, 30, 40, 50, 90, 250, 7,
  5, 6, 7, 8, 9, 10, 200, 100, 0, 1, 2, 3,
  255, 255, 255, 0, 0, 0, 128, 64, 32, 77, 88, 99,
]);

// RGB (H, W, 3) -> RGBA (H, W, 4) with alpha 255, as a canvas gives it.
function withAlpha(rgb) {
  const rgba = new Uint8Array((rgb.length / 3) * 4).fill(255);
  for (let i = 0; i < rgb.length / 3; i++) rgba.set(rgb.subarray(3 * i, 3 * i + 3), 4 * i);
  return rgba;
}

test("the picture's own size returns it channels first", () => {
  const rgb = Uint8Array.from({ length: 27 }, (_, i) => i * 9); // (3, 3, 3) HWC: pixel p, channel c is (3p + c) * 9
  const expected = Uint8Array.from({ length: 27 }, (_, j) => (3 * (j % 9) + Math.floor(j / 9)) * 9); // (3, 3, 3)
  assert.deepEqual(resizeBilinear(rgb, 3, 3, 3), expected);
  assert.deepEqual(resizeBilinear(withAlpha(rgb), 3, 3, 3), expected);
});

test("a constant picture stays constant, shrunk or enlarged, RGB or RGBA", () => {
  const rgb = new Uint8Array(17 * 9 * 3);
  for (let i = 0; i < rgb.length; i += 3) rgb.set([12, 200, 255], i);
  for (const size of [1, 5, 9, 40]) {
    const plane = size * size;
    const expected = new Uint8Array(3 * plane);
    expected.fill(12, 0, plane).fill(200, plane, 2 * plane).fill(255, 2 * plane);
    assert.deepEqual(resizeBilinear(rgb, 17, 9, size), expected, `size ${size}`);
    assert.deepEqual(resizeBilinear(withAlpha(rgb), 17, 9, size), expected, `size ${size}, RGBA`);
  }
});

test("a 4x3 picture shrunk to 2x2 gives Pillow 12's bytes", () => {
  // np.asarray(Image.fromarray(PICTURE).resize((2, 2), Image.BILINEAR)).transpose(2, 0, 1), Pillow 12.3.0
  const pillow = Uint8Array.from([84, 88, 93, 88, 20, 96, 82, 58, 88, 26, 74, 36]);
  assert.deepEqual(resizeBilinear(PICTURE, 4, 3, 2), pillow);
  assert.deepEqual(resizeBilinear(withAlpha(PICTURE), 4, 3, 2), pillow);
});

test("arguments that do not describe a picture are refused", () => {
  assert.throws(() => resizeBilinear(PICTURE, 4, 4, 2), /neither RGB nor RGBA of 4x4/);
  assert.throws(() => resizeBilinear(PICTURE, 4, 3, 0), /size must be a positive integer/);
  assert.throws(() => resizeBilinear(new Uint8Array(0), 0, 0, 2), /width must be a positive integer/);
});

test("a picture over MAX_PIXELS is refused in one line, as load_image does", () => {
  assert.equal(MAX_PIXELS, 50_000_000);
  checkPixels(10_000, 5_000, "ok.jpg"); // exactly the limit
  assert.throws(() => checkPixels(10_000, 5_001, "bomb.png"), {
    message: "bomb.png: image is 10000x5001 = 50 megapixels, over the limit of 50 (possible decompression bomb)",
  });
});

test("the size is read from a PNG, GIF, BMP, WebP or JPEG header before decoding", () => {
  const bytes = (...parts) => Uint8Array.from(parts.flatMap((p) => (typeof p === "string" ? [...p].map(
    (c) => c.charCodeAt(0)) : p)));
  const png = bytes([0x89], "PNG\r\n\x1a\n", [0, 0, 0, 13], "IHDR", [0, 1, 0, 0], [0, 0, 0x30, 0x39], [8, 2, 0, 0, 0]);
  assert.deepEqual(headerSize(png), { width: 65536, height: 12345 });
  assert.deepEqual(headerSize(bytes("GIF89a", [0x40, 0x01, 0xf0, 0x00], [0, 0, 0])), { width: 320, height: 240 });
  const bmp = bytes("BM", new Array(12).fill(0), [40, 0, 0, 0], [0x20, 0, 0, 0], [0xf0, 0xff, 0xff, 0xff], [1, 0]);
  assert.deepEqual(headerSize(bmp), { width: 32, height: 16 }); // a negative height: stored top-down
  const webp = bytes("RIFF", [0, 0, 0, 0], "WEBPVP8X", [10, 0, 0, 0], [0, 0, 0, 0], [0x3f, 0x1f, 0], [0xdf, 0x0f, 0]);
  assert.deepEqual(headerSize(webp), { width: 8000, height: 4064 });
  const jpeg = bytes([0xff, 0xd8], [0xff, 0xe1, 0, 4, 0, 0], [0xff, 0xc2, 0, 17, 8, 0x0b, 0xb8, 0x0f, 0xa0, 3]);
  assert.deepEqual(headerSize(jpeg), { width: 4000, height: 3000 });
  assert.equal(headerSize(bytes("%PDF-1.4 not an image at all")), null);
  assert.equal(headerSize(bytes([0xff, 0xd8], [0xff, 0xe1, 0x7f, 0xff])), null); // SOF beyond the bytes read
});
