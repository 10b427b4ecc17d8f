'use strict';
const crypto = require('crypto');

// crypto.createCipher derives key and IV from the passphrase (deprecated since
// Node 10, removed in Node 22).
function seal(passphrase, text) {
  const cipher = crypto.createCipher('aes-256-cbc', passphrase);
  return cipher.update(text, 'utf8', 'base64') + cipher.final('base64');
}

function open(passphrase, sealed) {
  const decipher = crypto.createDecipher('aes-256-cbc', passphrase);
  return decipher.update(sealed, 'base64', 'utf8') + decipher.final('utf8');
}

module.exports = { seal, open };
