// The download progress seam: what the runtime tells of content still
// arriving, so the agent counts an image's bytes while it downloads rather
// than all at once when it lands (src/api/set-bytes.ts). Optional, and
// built where the node's runtime is decided (src/agent/boot/pin-kit.ts):
// containerd lists its ingests (src/containerd/content.ts); CRI-O tells
// nothing through CRI or its own API, so there it is left out and an image
// counts when it lands.

export interface DownloadProgress {
  /**
   * Bytes the runtime holds of each blob of `blobs` (digest -> its size),
   * blobs of images it does not hold yet: a blob being written counts what
   * has arrived, a complete one its size; a blob it knows nothing of is
   * left out. Never throws: a runtime that cannot be asked answers what it
   * said last (or nothing).
   */
  arrived(blobs: ReadonlyMap<string, number>, signal?: AbortSignal): Promise<ReadonlyMap<string, number>>;
  close(): void;
}
