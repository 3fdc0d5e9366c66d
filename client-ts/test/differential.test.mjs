// Differential check against the Python core itself, beyond tests/vectors: test/python_cases.py
// (run with the Python that has Deniable installed) records thresholds and payloads of the real
// randomisers on a wider grid (ε0 from 0.1 to 20, odd domains, every OLH field size up to 27,
// default subset sizes); the TypeScript randomisers must match every threshold and payload while
// consuming exactly the recorded bytes.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { test } from "node:test";
import { hexToBytes, randomiserFor } from "../dist/index.js";
import { pythonBin } from "./services.mjs";

const run = promisify(execFile);

test("every randomiser matches the Python core on a wider grid of parameters", async () => {
  const script = fileURLToPath(new URL("python_cases.py", import.meta.url));
  const { stdout } = await run(pythonBin(), [script], { maxBuffer: 64 << 20 });
  const grid = JSON.parse(stdout);
  let cases = 0;
  for (const item of grid) {
    const label = `${item.mechanism} ε0=${item.epsilon0} d=${item.domain_size} ${JSON.stringify(item.params)}`;
    const randomiser = randomiserFor({ mechanism: item.proto, epsilon0: item.epsilon0, domainSize: item.domain_size, params: item.params });
    assert.equal(randomiser.payloadLength, item.payload_length, label);
    assert.deepEqual(
      Object.fromEntries(Object.entries(randomiser.thresholds).map(([k, v]) => [k, String(v)])),
      item.thresholds,
      label,
    );
    for (const c of item.cases) {
      const bytes = hexToBytes(c.randomness);
      let position = 0;
      const source = (count) => {
        assert.ok(position + count <= bytes.length, `${label}: read past the recorded randomness`);
        return bytes.slice(position, (position += count));
      };
      assert.equal(Buffer.from(randomiser.randomise(c.value, source)).toString("hex"), c.payload, `${label} value ${c.value}`);
      assert.equal(position, bytes.length, `${label}: every recorded byte consumed`);
      cases++;
    }
  }
  console.log(`# differential: ${grid.length} parameter sets, ${cases} payloads identical to the Python core`);
  assert.ok(grid.length >= 80);
});
