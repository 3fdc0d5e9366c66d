// Builds the browser bundle (bundle/deniable.min.js: ES module, minified, every dependency inlined)
// with esbuild, and with --report prints its size minified and minified+gzipped: whole, without the
// HPKE library (@hpke/*), and without HPKE nor Ed25519 (@noble/curves): the SDK's own code.
import { build } from "esbuild";
import { gzipSync } from "node:zlib";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("..", import.meta.url));
const common = { entryPoints: [`${root}src/index.ts`], bundle: true, minify: true, format: "esm", platform: "browser", target: "es2022", write: false, legalComments: "none" };

async function bytes(external) {
  const result = await build({ ...common, external });
  return result.outputFiles[0].contents;
}

await build({ ...common, write: true, outfile: `${root}bundle/deniable.min.js` });
if (process.argv.includes("--report")) {
  const rows = [
    ["whole bundle (SDK + HPKE + Ed25519)", await bytes([])],
    ["without HPKE (@hpke/*)", await bytes(["@hpke/*"])],
    ["SDK code only (without @hpke/* and @noble/*)", await bytes(["@hpke/*", "@noble/*"])],
  ];
  for (const [name, data] of rows) {
    const kb = (n) => (n / 1024).toFixed(1);
    console.log(`${name}: ${kb(data.length)} kB minified, ${kb(gzipSync(data, { level: 9 }).length)} kB min+gz`);
  }
}
