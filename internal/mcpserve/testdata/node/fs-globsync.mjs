// Node 20 has no fs.globSync, and the conformance suite imports it by name
// (`import {globSync} from "fs"`, used only by its tier-check command), so
// under Node 20 the suite does not even load. Setting fs.globSync from a
// --require preload does not help: the export names of a builtin's ES module
// are fixed when Node starts. Loaded with `node --import ./fs-globsync.mjs`,
// this registers a resolve hook that hands every importer of fs (but the
// stand-in itself) fs-globsync-module.mjs: all of fs plus a globSync made
// from the pinned glob package's. On a Node with fs.globSync it does nothing.
import fs from 'node:fs';
import { register } from 'node:module';

if (typeof fs.globSync !== 'function') {
  register('./fs-globsync-hooks.mjs', import.meta.url);
}
