// fs with a globSync, for Node 20 (see fs-globsync.mjs). glob's globSync
// takes the same (pattern, {cwd}) the suite passes and returns the same
// relative paths.
import fs from 'node:fs';
import { globSync as globGlobSync } from 'glob';

export * from 'node:fs';
export const globSync = typeof fs.globSync === 'function' ? fs.globSync : (pattern, options) => globGlobSync(pattern, options);
export default fs;
