// The kubelet's command line as systemd builds it (src/kubelet/systemd.ts)
// and its three flags as the kubelet's pflag reads them
// (src/kubelet/kubelet-flags.ts). The environment file cases are systemd's
// own (src/test/test-env-file.c, as of v254, where a backslash ending a
// comment line no longer continues it), re-expressed here; the unit and
// expansion cases follow systemd.service(5) and systemd.exec(5).
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { kubeletFlags } from '../../src/kubelet/kubelet-flags.ts';
import { expandArguments, parseEnvironmentFile, serviceDirectives, splitWords } from '../../src/kubelet/systemd.ts';

const env = (text: string) => Object.fromEntries(parseEnvironmentFile(text));

describe('environment files as systemd reads them (env-file.c parse_env_file_internal)', () => {
  test('test-env-file.c: backslash-newline joins lines, an escaped space stays, a trailing backslash ends the file', () => {
    assert.deepEqual(env('a=a\nb=b\\\nc\nd=d\\\ne\\\nf\ng=g\\ \nh=h\ni=i\\'), { a: 'a', b: 'bc', d: 'def', g: 'g ', h: 'h', i: 'i' });
    assert.deepEqual(env('a=a\\\n'), { a: 'a' });
  });
  test('test-env-file.c: a comment ends at its line, whatever ends it (v254)', () => {
    assert.deepEqual(env('#SPAMD_ARGS="-d --socketpath=/var/lib/bulwark/spamd \\\n#--nouser-config                                     \\\nnormal=line'), { normal: 'line' });
  });
  test('test-env-file.c: double quotes keep spaces; blank lines and comments between', () => {
    assert.deepEqual(env('# Generated\n\nHWMON_MODULES="coretemp f71882fg"\n\n# For compatibility reasons\n\nMODULE_0=coretemp\nMODULE_1=f71882fg'), {
      HWMON_MODULES: 'coretemp f71882fg',
      MODULE_0: 'coretemp',
      MODULE_1: 'f71882fg',
    });
    assert.deepEqual(env('a=\nb='), { a: '', b: '' });
  });
  test('quotes: single ones literal, double ones unescaping only " \\ ` $; adjacent parts joined; unquoted trailing whitespace dropped', () => {
    assert.deepEqual(env(`A='--x="y z" \\n'\nB="a \\"b\\" \\$c \\q"\nC="one" 'two'\nD=plain   \nE=  lead`), {
      A: '--x="y z" \\n',
      B: 'a "b" $c \\q',
      C: 'onetwo',
      D: 'plain',
      E: 'lead',
    });
  });
  test('what is not an assignment is left out: no "=", a key that is no variable name (no "export"), ";" comments; a later one wins', () => {
    assert.deepEqual(env('just words\nexport A=1\n; B=2\n  C = 3\nC=4\n'), { C: '4' });
  });
});

describe('word splitting (extract_first_word, EXTRACT_UNQUOTE | EXTRACT_RELAX)', () => {
  test('at whitespace; quotes anywhere in a word removed; a backslash takes the next character, in quotes too', () => {
    assert.deepEqual(splitWords(`--config-dir=/etc/kubernetes/kubelet.conf.d  --feature-gates='A=true,B=false'\t--node-labels="a=b c"`), [
      '--config-dir=/etc/kubernetes/kubelet.conf.d',
      '--feature-gates=A=true,B=false',
      '--node-labels=a=b c',
    ]);
    assert.deepEqual(splitWords(`a\\ b 'c\\'d' "" x`), ['a b', "c'd", '', 'x']);
    assert.deepEqual(splitWords('  '), []);
  });
  test('an unclosed quote or a trailing backslash ends the last word (RELAX)', () => {
    assert.deepEqual(splitWords(`--a="b c`), ['--a=b c']);
    assert.deepEqual(splitWords('x y\\'), ['x', 'y']);
  });
  test('in unit files C escapes are read', () => {
    assert.deepEqual(splitWords('a\\tb', true), ['a\tb']);
    assert.deepEqual(splitWords('a\\tb'), ['atb']);
  });
});

describe('a service\'s unit and drop-ins (conf-parser.c, load-fragment.c)', () => {
  test('Environment= words are assignments, an empty one resets; EnvironmentFile= "-" is optional; the last ExecStart= counts, an empty one resets', () => {
    const s = serviceDirectives([
      '[Unit]\nDescription=kubelet\n[Service]\nEnvironment="A=1 2" B=3\nEnvironmentFile=/etc/a\nExecStart=/usr/bin/kubelet --x\n',
      '[Service]\nEnvironment=\nEnvironment=C=4\nEnvironmentFile=-/etc/b\nExecStart=\nExecStart=-/usr/bin/kubelet $ARGS --y\n',
    ]);
    assert.deepEqual(Object.fromEntries(s.environment), { C: '4' });
    assert.deepEqual(s.environmentFiles, [{ path: '/etc/a', optional: false }, { path: '/etc/b', optional: true }]);
    assert.deepEqual(s.execStart, { args: ['$ARGS', '--y'], expand: true });
  });
  test('continuation lines joined with a space, comment lines between them skipped; another section\'s keys ignored; ":" turns expansion off; "@" names argv[0]', () => {
    const s = serviceDirectives(['[Service]\nExecStart=/usr/local/bin/kubenswrapper \\\n    /usr/bin/kubelet \\\n# a comment\n      --config=/etc/kubernetes/kubelet.conf \\\n      --v=2\n[Install]\nExecStart=/nope\n']);
    assert.deepEqual(s.execStart, { args: ['/usr/bin/kubelet', '--config=/etc/kubernetes/kubelet.conf', '--v=2'], expand: true });
    assert.deepEqual(serviceDirectives(['[Service]\nExecStart=:/bin/kubelet $X']).execStart, { args: ['$X'], expand: false });
    assert.deepEqual(serviceDirectives(['[Service]\nExecStart=@/bin/kubelet kubelet --a']).execStart, { args: ['--a'], expand: true });
  });
  test('"$FOO" alone is split into words (quotes honoured), "${FOO}" in a word is put in whole, an unset one is nothing, "$$" is "$"', () => {
    const vars = new Map([
      ['ARGS', `--config-dir=/x  --feature-gates='A=true'`],
      ['IP', '10.0.0.1 10.0.0.2'],
    ]);
    assert.deepEqual(expandArguments(['$ARGS', '--node-ip=${IP}', '$UNSET', 'a$$b', '${UNSET}x'], vars), [
      { word: '--config-dir=/x', variable: 'ARGS' },
      { word: '--feature-gates=A=true', variable: 'ARGS' },
      { word: '--node-ip=10.0.0.1 10.0.0.2', variable: 'IP' },
      { word: 'a$b' },
      { word: 'x', variable: 'UNSET' },
    ]);
  });
});

describe('the kubelet\'s --config, --config-dir and --feature-gates (pflag)', () => {
  test('"--name=value" and "--name value", "_" as "-", the last one winning; other flags passed over; "--" ends the flags', () => {
    const f = kubeletFlags(['--config=/a', '--v', '2', '--config-dir', '/d1', '--config_dir=/d2', '--config', '/b', '--', '--config=/c']);
    assert.equal(f.config, '/b');
    assert.equal(f.configDir, '/d2');
    assert.deepEqual(f.at, { config: 6, configDir: 5 });
    assert.deepEqual(f.problems, []);
  });
  test('--feature-gates add up, a later value of a gate winning; booleans as Go reads them; what the kubelet refuses is said', () => {
    const f = kubeletFlags(['--feature-gates=A=true, B=0', '--feature-gates', 'A=F,C=T', '--feature-gates=D=yes,E']);
    assert.deepEqual(f.featureGates, { A: false, B: false, C: true });
    assert.deepEqual(f.problems, ['--feature-gates "D=yes": "yes" is not a boolean', '--feature-gates "E": no "=" (Name=true or Name=false)']);
    assert.deepEqual(kubeletFlags(['--config-dir']).problems, ['--config-dir without a value']);
  });
});
