'use strict';
const test = require('node:test');
const assert = require('node:assert');
const { seal, open } = require('..');

test('a sealed secret opens with the same passphrase', () => {
  const sealed = seal('correct horse', 'the launch code');
  assert.notStrictEqual(sealed, 'the launch code');
  assert.strictEqual(open('correct horse', sealed), 'the launch code');
});

test('a wrong passphrase does not open it', () => {
  const sealed = seal('correct horse', 'the launch code');
  assert.throws(() => {
    const opened = open('battery staple', sealed);
    if (opened !== 'the launch code') throw new Error('wrong secret');
  });
});
