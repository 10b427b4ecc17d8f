"""The legacy-vault example's Node 16 crypto calls and their Node 22 replacements."""

from __future__ import annotations

OLD_SEAL = """function seal(passphrase, text) {
  const cipher = crypto.createCipher('aes-256-cbc', passphrase);
  return cipher.update(text, 'utf8', 'base64') + cipher.final('base64');
}"""
NEW_SEAL = """function seal(passphrase, text) {
  const salt = crypto.randomBytes(16);
  const iv = crypto.randomBytes(16);
  const key = crypto.scryptSync(passphrase, salt, 32);
  const cipher = crypto.createCipheriv('aes-256-cbc', key, iv);
  const body = Buffer.concat([cipher.update(text, 'utf8'), cipher.final()]);
  return Buffer.concat([salt, iv, body]).toString('base64');
}"""
OLD_OPEN = """function open(passphrase, sealed) {
  const decipher = crypto.createDecipher('aes-256-cbc', passphrase);
  return decipher.update(sealed, 'base64', 'utf8') + decipher.final('utf8');
}"""
NEW_OPEN = """function open(passphrase, sealed) {
  const raw = Buffer.from(sealed, 'base64');
  const key = crypto.scryptSync(passphrase, raw.subarray(0, 16), 32);
  const decipher = crypto.createDecipheriv('aes-256-cbc', key, raw.subarray(16, 32));
  return Buffer.concat([decipher.update(raw.subarray(32)), decipher.final()]).toString('utf8');
}"""
