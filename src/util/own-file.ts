// A file pinset keeps and rewrites in place, in a folder of its own (the
// node lock, <state-dir>/agent.lock): opened so that a name planted there
// by someone else is refused rather than written through.
// - O_NOFOLLOW: a symbolic link at the name fails with ELOOP;
// - O_NONBLOCK and O_NOCTTY: a FIFO or a device at the name opens at once
//   and is refused below, instead of blocking or becoming a terminal;
// - fstat(2) of what was opened: a regular file with exactly one link. A
//   hard link planted at the name shares its inode with another file (a
//   link count of 2 or more), which truncating and writing the lock would
//   overwrite.
// A lock file is never deleted and made anew (the lock would split), so
// O_EXCL alone cannot be used: the checks above are what O_EXCL gives a
// temp file. The read-only twin applies the same checks to a file pinset
// may only lock, not write (its folder read-only here): what it opens is
// what a writer elsewhere would write through.
import { constants as fsc } from 'node:fs';
import * as fs from 'node:fs';

/** The file at the name is not one pinset may rewrite: a link, a hard link, not a regular file. */
export class OwnFileError extends Error {
  /** ELOOP for a symbolic link, EPERM for anything else that is not pinset's to write. */
  readonly code: 'EPERM' | 'ELOOP';
  constructor(message: string, code: OwnFileError['code'] = 'EPERM') {
    super(message);
    this.name = 'OwnFileError';
    this.code = code;
  }
}

/**
 * Opens `file` read-write, creating it with `mode` when missing; throws
 * OwnFileError when the name is not a
 * regular file of one link. The caller owns the descriptor.
 */
export function openOwnFileSync(file: string, mode = 0o644): number {
  return checked(file, () => fs.openSync(file, fsc.O_RDWR | fsc.O_CREAT | fsc.O_NOFOLLOW | fsc.O_NONBLOCK | fsc.O_NOCTTY, mode));
}

/** openOwnFileSync for a file that is there and is only read or locked: never created (ENOENT when missing), the same refusals. */
export function openOwnFileReadOnlySync(file: string): number {
  return checked(file, () => fs.openSync(file, fsc.O_RDONLY | fsc.O_NOFOLLOW | fsc.O_NONBLOCK | fsc.O_NOCTTY));
}

/** The descriptor `open` gives, once fstat(2) shows a regular file of one link; closed and refused otherwise. */
function checked(file: string, open: () => number): number {
  let fd: number;
  try {
    fd = open();
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ELOOP') throw new OwnFileError(`${file} is a symbolic link: pinset writes only its own file there; remove the link`, 'ELOOP');
    throw e;
  }
  try {
    const st = fs.fstatSync(fd);
    if (!st.isFile()) throw new OwnFileError(`${file} is not a regular file: pinset writes only its own file there; remove it`);
    if (st.nlink !== 1) throw new OwnFileError(`${file} has ${st.nlink} hard links: another name shares it, which writing it would overwrite; remove ${file}`);
    return fd;
  } catch (e) {
    fs.closeSync(fd);
    throw e;
  }
}
