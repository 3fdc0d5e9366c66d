/**
 * HPKE (RFC 9180) base mode, DHKEM(X25519, HKDF-SHA256) / HKDF-SHA256 / ChaCha20-Poly1305, through
 * the maintained `@hpke/*` packages (docs/wire.md §4): ciphertext = enc (32 bytes) ‖ Seal(plaintext).
 */
import { CipherSuite, HkdfSha256 } from "@hpke/core";
import { Chacha20Poly1305 } from "@hpke/chacha20poly1305";
import { DhkemX25519HkdfSha256 } from "@hpke/dhkem-x25519";

let cached: CipherSuite | undefined;

/** The one suite Deniable uses (created lazily: constructing it touches WebCrypto). */
export function suite(): CipherSuite {
  cached ??= new CipherSuite({
    kem: new DhkemX25519HkdfSha256(),
    kdf: new HkdfSha256(),
    aead: new Chacha20Poly1305(),
  });
  return cached;
}

/** enc ‖ ciphertext of `plaintext` sealed to the raw 32-byte X25519 `publicKey` with `info`, empty aad. */
export async function seal(publicKey: Uint8Array, info: Uint8Array, plaintext: Uint8Array): Promise<Uint8Array> {
  const s = suite();
  const recipientPublicKey = await s.kem.deserializePublicKey(publicKey);
  const { ct, enc } = await s.seal({ recipientPublicKey, info }, plaintext);
  const out = new Uint8Array(enc.byteLength + ct.byteLength);
  out.set(new Uint8Array(enc), 0);
  out.set(new Uint8Array(ct), enc.byteLength);
  return out;
}

/** Open enc ‖ ciphertext with the raw X25519 private key (tests: the vectors are in this direction). */
export async function open(privateKey: Uint8Array, info: Uint8Array, sealed: Uint8Array): Promise<Uint8Array> {
  const s = suite();
  const recipientKey = await s.kem.deserializePrivateKey(privateKey);
  const opened = await s.open({ recipientKey, enc: sealed.slice(0, 32), info }, sealed.slice(32));
  return new Uint8Array(opened);
}
