#!/usr/bin/env node
// Send N simulated devices' answers to a Deniable shuffler over HTTPS:
//   node examples/send.mjs --shuffler https://HOST:PORT --ca CA.pem --campaign ID --aggregator-key HEX --devices N [--value V]
// Each device's answer is randomised on "the device" (here), sealed to the aggregator and queued; then
// the queue is sent. Without --value every device answers a uniformly random category. Last line:
// "sent N, acknowledged A".
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { HttpTransport, MemoryStore, Reporter, csprng, randbelow } from "@deniable/client";
import { nodeFetch } from "@deniable/client/node";

const { values: args } = parseArgs({
  options: {
    shuffler: { type: "string" }, ca: { type: "string" }, campaign: { type: "string" },
    "aggregator-key": { type: "string" }, devices: { type: "string" }, value: { type: "string" },
  },
});
for (const name of ["shuffler", "campaign", "aggregator-key", "devices"]) {
  if (args[name] === undefined) {
    console.error(`missing --${name}\nusage: send.mjs --shuffler https://HOST:PORT --ca CA.pem --campaign ID --aggregator-key HEX --devices N [--value V]`);
    process.exit(2);
  }
}
const devices = Number(args.devices);
if (!Number.isInteger(devices) || devices < 1) {
  console.error(`--devices must be a positive integer, got ${args.devices}`);
  process.exit(2);
}

const fetch = nodeFetch({ ca: args.ca === undefined ? undefined : readFileSync(args.ca) });
const reporter = await Reporter.fetch(args.campaign, {
  transport: new HttpTransport(args.shuffler, { fetch }),
  store: new MemoryStore(),
  aggregatorKey: args["aggregator-key"],
});
const domain = reporter.checked.randomiser.domainSize;
const answers = Array.from({ length: devices }, () =>
  args.value === undefined ? Number(randbelow(csprng, BigInt(domain))) : Number(args.value),
);
await reporter.recordMany(answers);
const result = await reporter.sendPending();
if (result.rejected > 0) console.error(`rejected: ${JSON.stringify(result.rejections)}`);
console.log(`sent ${devices}, acknowledged ${result.acknowledged}`);
