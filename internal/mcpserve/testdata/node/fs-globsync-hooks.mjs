// The resolve hook fs-globsync.mjs registers (see there for why): fs and
// node:fs resolve to the stand-in module, except from the stand-in itself.
const standIn = new URL('./fs-globsync-module.mjs', import.meta.url).href;

export async function resolve(specifier, context, nextResolve) {
  if ((specifier === 'fs' || specifier === 'node:fs') && context.parentURL !== standIn) {
    return { url: standIn, shortCircuit: true };
  }
  return nextResolve(specifier, context);
}
