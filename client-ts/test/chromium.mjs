// Chromium for the browser tests: Debian's /usr/bin/chromium (or $CHROMIUM_BIN), never a download.
import { createHash, X509Certificate } from "node:crypto";

/** Base64 SHA-256 of a certificate's SubjectPublicKeyInfo: Chromium's SPKI pin. */
export function spkiPin(pem) {
  const spki = new X509Certificate(pem).publicKey.export({ type: "spki", format: "der" });
  return createHash("sha256").update(spki).digest("base64");
}

/** Chromium's arguments for these tests (also used by the README snippet test). */
export function chromiumArgs(pin) {
  return ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", `--ignore-certificate-errors-spki-list=${pin}`];
}

