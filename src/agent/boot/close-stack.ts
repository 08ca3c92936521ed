// What the composition root built, closed in reverse order (as Go's defer,
// or controller-runtime's manager stops its Runnables): each builder's
// close() is pushed as the part is built, and a run that ends, however it
// ends, unwinds what it got to.
export class CloseStack {
  private readonly closes: (() => void | Promise<void>)[] = [];

  /** `part` is closed (its close()) when the stack unwinds; returns it. */
  push<T extends { close(): void | Promise<void> }>(part: T): T {
    this.closes.push(() => part.close());
    return part;
  }

  /** `close` runs when the stack unwinds. */
  defer(close: () => void | Promise<void>): void {
    this.closes.push(close);
  }

  /** Close everything, the last built first. */
  async unwind(): Promise<void> {
    while (this.closes.length > 0) await this.closes.pop()!();
  }
}
