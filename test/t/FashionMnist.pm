# Fashion-MNIST (Debian package dataset-fashion-mnist) for the TAP tests:
# where it is, and its idx files converted to COPY text (id, label, real[784]).
package FashionMnist;

use strict;
use warnings;

use IO::Uncompress::Gunzip qw(gunzip $GunzipError);

our $datadir = '/usr/share/datasets/fashion-mnist';
our @files = qw(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz
  t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz);

# True when every file is readable.
sub available
{
	return !grep { !-r "$datadir/$_" } @files;
}

# Converts one idx image file and its label file to COPY text: id, label,
# embedding. Returns the number of rows written.
sub idx_to_copy
{
	my ($images, $labels, $limit, $path) = @_;
	my ($img, $lab);
	gunzip("$datadir/$images" => \$img) or die "gunzip $images: $GunzipError";
	gunzip("$datadir/$labels" => \$lab) or die "gunzip $labels: $GunzipError";
	my ($magic, $n, $rows, $cols) = unpack('N4', $img);
	die "$images: not an idx3 ubyte file" unless $magic == 0x803;
	my ($lmagic, $ln) = unpack('N2', $lab);
	die "$labels: not an idx1 ubyte file for $images"
	  unless $lmagic == 0x801 && $ln == $n;
	$n = $limit if $limit < $n;
	my $dim = $rows * $cols;
	open my $out, '>', $path or die "$path: $!";
	for my $i (0 .. $n - 1)
	{
		my @pixels = unpack('C*', substr($img, 16 + $i * $dim, $dim));
		my $label = unpack('C', substr($lab, 8 + $i, 1));
		print $out $i + 1, "\t$label\t{", join(',', @pixels), "}\n";
	}
	close $out;
	return $n;
}

1;
