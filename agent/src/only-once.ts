/** Wraps a listener so that only its first call goes through (a link ends once, whichever way). */
export function onlyOnce(l: (err: Error) => void): (err: Error) => void {
  let called = false;
  return (err) => {
    if (called) return;
    called = true;
    l(err);
  };
}
