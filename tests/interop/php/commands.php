<?php
// PHP's memcached extension (Debian's php8.2-memcached, on libmemcached.so.11): the same
// script runs on the real libmemcached and on libmemfabric; its output must be the same
// (tests/interop/test_libmemfabric.py). Usage: php commands.php PORT [binary]
$port = (int)$argv[1];
$m = new Memcached();
$m->setOption(Memcached::OPT_BINARY_PROTOCOL, (bool)($argv[2] ?? false));
$m->addServer('127.0.0.1', $port);
var_dump($m->set('a', 'hello'));
var_dump($m->get('a'));
var_dump($m->get('missing'), $m->getResultCode(), $m->getResultMessage());
var_dump($m->setMulti(['x' => 1, 'y' => [1, 2], 'z' => 'zz']));
var_dump($m->getMulti(['x', 'y', 'z', 'nope']));
$r = $m->get('a', null, Memcached::GET_EXTENDED);
var_dump($r['value'], $r['flags']);
var_dump($m->cas($r['cas'], 'a', 'new'));
var_dump($m->cas($r['cas'], 'a', 'again'), $m->getResultCode());
var_dump($m->get('a'));
var_dump($m->set('n', 5), $m->increment('n', 3), $m->decrement('n', 10));
var_dump($m->increment('nokey'), $m->getResultCode());
var_dump($m->delete('a'), $m->delete('a'), $m->getResultCode());
var_dump($m->add('b', 1), $m->add('b', 2), $m->getResultCode());
var_dump($m->replace('c', 1), $m->getResultCode());
var_dump($m->touch('b', 100), $m->touch('nope', 100));
var_dump($m->deleteMulti(['x', 'y', 'nope']));
var_dump(count($m->getStats()), count($m->getVersion()));
var_dump($m->set(str_repeat('k', 251), 1), $m->getResultCode());
var_dump($m->set(str_repeat('k', 250), 1), $m->getResultCode());
$m->setOption(Memcached::OPT_COMPRESSION, false);
var_dump($m->set('big', str_repeat('x', 2 * 1024 * 1024)), $m->getResultCode());
var_dump($m->set('ap', 'mid'), $m->append('ap', '-end'), $m->prepend('ap', 'start-'), $m->get('ap'));
$m->setOption(Memcached::OPT_PREFIX_KEY, 'ns:');
var_dump($m->set('p', 'prefixed'), $m->get('p'));
$m->setOption(Memcached::OPT_PREFIX_KEY, '');
var_dump($m->get('ns:p'));
var_dump($m->flush());
var_dump($m->get('b'), $m->getResultCode());
$dead = new Memcached();
$dead->addServer('127.0.0.1', (int)($argv[3] ?? 1));
var_dump($dead->set('a', 1), $dead->getResultCode());
var_dump($dead->get('a'), $dead->getResultCode());
