import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { helpText, parseDuration, parseFlags, UsageError, type FlagSpec } from '../../src/util/flags.ts';

const specs: FlagSpec[] = [
  { name: 'node-name', env: 'NODE_NAME', type: 'string', required: true, help: 'this node' },
  { name: 'reload', env: 'PINSET_RELOAD', type: 'string', default: 'dbus', choices: ['dbus', 'systemctl', 'none'], help: 'how to reload' },
  { name: 'max-parallel-pulls', env: 'PINSET_MAX_PARALLEL_PULLS', type: 'int', default: 3, help: 'pulls at once' },
  { name: 'resync-interval', env: 'PINSET_RESYNC_INTERVAL', type: 'duration', default: '5m', help: 'full resync' },
  { name: 'once', env: 'PINSET_ONCE', type: 'bool', default: false, help: 'one reconcile' },
  { name: 'no-env', type: 'string', help: 'no twin' },
];

const parse = (argv: string[], env: Record<string, string> = {}) => parseFlags(specs, argv, env);

describe('parseFlags', () => {
  test('defaults apply, durations in milliseconds', () => {
    const { values, positional } = parse(['--node-name', 'n1']);
    assert.deepEqual(values, { 'node-name': 'n1', reload: 'dbus', 'max-parallel-pulls': 3, 'resync-interval': 300_000, once: false });
    assert.deepEqual(positional, []);
  });

  test('command line beats environment beats default', () => {
    const env = { NODE_NAME: 'from-env', PINSET_RELOAD: 'none', PINSET_MAX_PARALLEL_PULLS: '8' };
    const a = parse([], env).values;
    assert.equal(a['node-name'], 'from-env');
    assert.equal(a.reload, 'none');
    assert.equal(a['max-parallel-pulls'], 8);
    const b = parse(['--node-name=cli', '--reload', 'systemctl'], env).values;
    assert.equal(b['node-name'], 'cli');
    assert.equal(b.reload, 'systemctl');
  });

  test('short aliases: -o value, -o=value, -ovalue; "-" is a positional argument', () => {
    const withShort: FlagSpec[] = [
      { name: 'output', type: 'string', short: 'o', choices: ['table', 'json'], default: 'table', help: 'format' },
      { name: 'verbose', type: 'bool', short: 'v', default: false, help: 'more' },
    ];
    for (const argv of [['-o', 'json'], ['-o=json'], ['-ojson'], ['--output', 'json']]) {
      assert.equal(parseFlags(withShort, argv, {}).values.output, 'json', argv.join(' '));
    }
    assert.equal(parseFlags(withShort, ['-v'], {}).values.verbose, true);
    assert.deepEqual(parseFlags(withShort, ['-', 'file.yaml'], {}).positional, ['-', 'file.yaml']);
    assert.throws(() => parseFlags(withShort, ['-x'], {}), /unknown flag -x/);
    assert.throws(() => parseFlags(withShort, ['-o'], {}), /-o needs a value/);
    assert.throws(() => parseFlags(withShort, ['-o', 'yaml'], {}), /-o: "yaml" is not one of table, json/);
    assert.match(helpText('x', 'y', withShort), /-o, --output table\|json/);
  });

  test('an empty environment value counts only for flags where empty means something', () => {
    const addr: FlagSpec[] = [{ name: 'metrics-addr', env: 'ADDR', type: 'string', default: '0.0.0.0:9402', allowEmpty: true, help: 'listener' }];
    assert.equal(parseFlags(addr, [], { ADDR: '' }).values['metrics-addr'], '');
    assert.equal(parseFlags(addr, [], {}).values['metrics-addr'], '0.0.0.0:9402');
  });

  test('an empty environment variable counts as unset', () => {
    assert.equal(parse(['--node-name', 'n'], { PINSET_RELOAD: '' }).values.reload, 'dbus');
  });

  test('bool flags: bare, =value, and from the environment', () => {
    assert.equal(parse(['--node-name', 'n', '--once']).values.once, true);
    assert.equal(parse(['--node-name', 'n', '--once=false']).values.once, false);
    assert.equal(parse(['--node-name', 'n'], { PINSET_ONCE: 'yes' }).values.once, true);
    assert.equal(parse(['--node-name', 'n'], { PINSET_ONCE: '0' }).values.once, false);
    assert.throws(() => parse(['--node-name', 'n', '--once=maybe']), /--once: "maybe" is not true or false/);
  });

  test('bad values are usage errors naming the flag or the variable', () => {
    const cases: [string[], Record<string, string>, RegExp][] = [
      [['--node-name', 'n', '--reload', 'kill'], {}, /^--reload: "kill" is not one of dbus, systemctl, none$/],
      [['--node-name', 'n', '--max-parallel-pulls', 'three'], {}, /^--max-parallel-pulls: "three" is not a whole number$/],
      [['--node-name', 'n', '--max-parallel-pulls=-1'], {}, /is not a whole number/],
      [['--node-name', 'n'], { PINSET_MAX_PARALLEL_PULLS: '2.5' }, /^PINSET_MAX_PARALLEL_PULLS: "2.5" is not a whole number$/],
      [['--node-name', 'n', '--resync-interval', '5 minutes'], {}, /^--resync-interval: "5 minutes" is not a duration/],
      [['--node-name', 'n', '--bogus'], {}, /^unknown flag --bogus$/],
      [['--node-name'], {}, /^--node-name needs a value$/],
      [[], {}, /^--node-name \(or NODE_NAME\) is required$/],
      [['--node-name='], {}, /^--node-name \(or NODE_NAME\) is required$/],
    ];
    for (const [argv, env, re] of cases) {
      assert.throws(
        () => parse(argv, env),
        (e: unknown) => e instanceof UsageError && re.test(e.message),
        argv.join(' '),
      );
    }
  });

  test('--help and -h skip the required check', () => {
    assert.equal(parse(['--help']).values.help, true);
    assert.equal(parse(['-h']).values.help, true);
  });

  test('positional arguments, and everything after --', () => {
    const { positional, values } = parse(['a.yaml', '--node-name', 'n', 'b.yaml', '--', '--once', 'c']);
    assert.deepEqual(positional, ['a.yaml', 'b.yaml', '--once', 'c']);
    assert.equal(values.once, false);
  });

  test('a flag without an environment twin ignores the environment', () => {
    assert.equal(parse(['--node-name', 'n'], { 'no-env': 'x', NO_ENV: 'x' }).values['no-env'], undefined);
  });
});

describe('parseDuration', () => {
  test('units and bare seconds', () => {
    assert.equal(parseDuration('250ms'), 250);
    assert.equal(parseDuration('30s'), 30_000);
    assert.equal(parseDuration('1.5s'), 1_500);
    assert.equal(parseDuration('5m'), 300_000);
    assert.equal(parseDuration('1h'), 3_600_000);
    assert.equal(parseDuration('10'), 10_000);
    assert.equal(parseDuration(' 2m '), 120_000);
  });
  test('refuses what it cannot read', () => {
    for (const s of ['', 'm', '-1s', '1d', '1m30s', 'abc']) assert.throws(() => parseDuration(s), UsageError, s);
  });
});

describe('helpText', () => {
  test('one line per flag with its environment twin and default', () => {
    const text = helpText('pinset agent [flags]', 'Runs the node agent.', specs);
    const [usage, summary, flags] = text.split('\n\n');
    assert.equal(summary, 'Runs the node agent.');
    assert.match(usage!, /^usage: pinset agent --node-name STRING /, 'a required flag without brackets, in place of [flags]');
    assert.match(usage!, /\[--reload dbus\|systemctl\|none\]/);
    assert.match(usage!, /\[--once\]/);
    const lines = flags!.trimEnd().split('\n').slice(1);
    assert.equal(lines.length, specs.length);
    const reload = lines.find((l) => l.includes('--reload'))!;
    assert.match(reload, /--reload dbus\|systemctl\|none/);
    assert.match(reload, /\(env PINSET_RELOAD, default "dbus"\)/);
    assert.match(lines.find((l) => l.includes('--node-name'))!, /\(env NODE_NAME, required\)/);
    assert.match(lines.find((l) => l.includes('--once'))!, /^ {2}--once {2,}one reconcile/);
  });

  test('the usage line names every flag: those it names already are kept as written, the others added, lines wrapped', () => {
    const text = helpText('pinset agent [--once] [-o FORMAT] FILE...', 'x', [...specs, { name: 'output', short: 'o', type: 'string', help: 'y' }]);
    const usage = text.split('\n\n')[0]!;
    assert.equal((usage.match(/--once/g) ?? []).length, 1, 'named once');
    assert.doesNotMatch(usage, /--output/, 'its alias names it');
    for (const s of specs) assert.match(usage, new RegExp(`--${s.name}(?![\\w-])`));
    assert.ok(usage.split('\n').every((l) => l.length <= 110), 'wrapped');
    assert.ok(usage.split('\n').slice(1).every((l) => l.startsWith('       [') || l.startsWith('       -')), 'continued under the command, whole flags per line');
  });
});

describe('number flags', () => {
  const factor: FlagSpec[] = [{ name: 'disk-estimate-factor', env: 'PINSET_DISK_ESTIMATE_FACTOR', type: 'number', default: 2, help: 'x' }];
  test('whole and decimal numbers, from the command line or the environment; the default otherwise', () => {
    assert.equal(parseFlags(factor, ['--disk-estimate-factor', '1.5'], {}).values['disk-estimate-factor'], 1.5);
    assert.equal(parseFlags(factor, [], { PINSET_DISK_ESTIMATE_FACTOR: '3' }).values['disk-estimate-factor'], 3);
    assert.equal(parseFlags(factor, [], {}).values['disk-estimate-factor'], 2);
  });
  test('anything else is a usage error naming where it came from', () => {
    assert.throws(() => parseFlags(factor, ['--disk-estimate-factor=two'], {}), /--disk-estimate-factor: "two" is not a number/);
    assert.throws(() => parseFlags(factor, [], { PINSET_DISK_ESTIMATE_FACTOR: '-1' }), /PINSET_DISK_ESTIMATE_FACTOR: "-1" is not a number/);
  });
});
